"""The onnxruntime targets (cpu, and cuda, which serves the same fp32 graph): export, fuse, quantise, verify."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from encoderrt.compile.build import Build
from encoderrt.runtime.backends.onnxruntime_cpu import weights_file
from encoderrt.runtime.cpu import int8_dot_products
from encoderrt.runtime.manifest import Manifest

MODEL_FILE = "model.onnx"
PRECISIONS = {"cpu": ("fp32", "int8"), "cuda": ("fp32",)}


def build(build: Build, folder: Path) -> Manifest:
    from encoderrt.compile.export import export_onnx, load_export_model
    from encoderrt.compile.optimize import fuse
    from encoderrt.compile.quantize import int8_attempts, quantize_int8

    source, precision, reporter = build.source, build.options.precision, build.reporter
    exported, optimized, final = build.work / "exported.onnx", build.work / "optimized.onnx", folder / MODEL_FILE
    if "onnx_fused_ops" not in build.shared:  # another candidate of this compile may have exported already
        with reporter.step("export", f"{source.architecture.name} {source.task} from {source.kind} folder"):
            export_onnx(source, load_export_model(source, "onnxruntime"), exported)
        with reporter.step("optimise", "fusing attention, LayerNorm and GELU"):
            build.shared["onnx_fused_ops"] = fuse(source, exported, optimized)
    fused_ops = build.shared["onnx_fused_ops"]
    # parity runs on onnxruntime's CPU provider, whichever target serves the graph
    manifest = build.manifest(folder, fused_ops, target="cpu", model_file=MODEL_FILE)
    if precision != "int8":
        save_with_weights_beside(optimized, final)
        figures, failures = build.verify(manifest, folder)
        build.require(figures, failures)
        return replace(manifest, parity=figures, target=build.options.target)
    attempts, unsigned = [], not int8_dot_products()
    for keep_fp32, kept in int8_attempts(optimized):
        detail = "dynamic int8, per channel" + (", uint8 weights (this CPU has no VNNI)" if unsigned else "") + kept
        with reporter.step("quantise", detail):
            quantize_int8(optimized, final, keep_fp32, unsigned)
            save_with_weights_beside(final, final)
        figures, failures = build.verify(manifest, folder)
        attempts.append({"fp32_nodes": list(keep_fp32), "parity": figures, "failures": failures})
        if not failures:
            break
    build.require(figures, failures)
    return replace(manifest, parity={**figures, "fp32_nodes": list(keep_fp32), "attempts": attempts[:-1],
                                     "weights": "uint8" if unsigned else "int8"},
                   target=build.options.target)


def save_with_weights_beside(graph: Path, destination: Path) -> None:
    """Write `graph` to `destination` with its weights in a file beside it (weights_file), which onnxruntime maps
    instead of copying them into each session: a backend's sessions, and servers on one machine, share one copy."""
    import onnx

    model = onnx.load(str(graph))
    weights = weights_file(destination)
    weights.unlink(missing_ok=True)  # an earlier attempt's: onnx appends to the file it finds
    onnx.save_model(model, str(destination), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=weights.name, size_threshold=1024)
