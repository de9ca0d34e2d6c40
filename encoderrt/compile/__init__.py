"""Compile a Hugging Face / sentence-transformers folder into a verified encoderrt artifact."""

from encoderrt.compile.errors import CompileError, FusionError, InputError, ParityError
from encoderrt.compile.options import CompileOptions
from encoderrt.compile.pipeline import CompileResult, compile_model

__all__ = ["CompileError", "CompileOptions", "CompileResult", "FusionError", "InputError", "ParityError", "compile_model"]
