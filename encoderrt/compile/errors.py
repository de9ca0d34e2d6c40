"""Compile errors, each with the exit code the command line returns for it."""

from __future__ import annotations


class CompileError(Exception):
    exit_code = 1


class InputError(CompileError):
    """The user's input is wrong (folder, flags, weights): exit code 2, nothing written."""

    exit_code = 2


class FusionError(CompileError):
    """The optimised graph kept unfused attention or normalisation: a silent performance bug."""


class ParityError(CompileError):
    """The compiled engine disagrees with the PyTorch reference beyond tolerance."""
