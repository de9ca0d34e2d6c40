"""The onnxruntime targets (cpu, and cuda, which serves the same fp32 graph): export, fuse, quantise, verify."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

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
            weights_file(final).unlink(missing_ok=True)  # an earlier attempt's: onnx appends to the file it finds
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
    """Write `graph` to `destination` with its weights in one file beside it (weights_file), which onnxruntime maps
    instead of copying them into each session: a backend's sessions, and servers on one machine, share one copy.

    The weights are copied tensor by tensor, from the graph or the files beside it, never held all at once: a
    2.3 GB model's graph loaded whole takes twice its size in protobuf's memory."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(str(graph), load_external_data=False)
    weights = weights_file(destination)
    staged = weights.with_name(weights.name + ".partial")  # `graph`'s own weights may be the file being replaced
    with staged.open("wb") as out:
        for tensor in _tensors(model.graph):
            if uses_external_data(tensor):
                info = ExternalDataInfo(tensor)
                with (graph.parent / info.location).open("rb") as source:
                    source.seek(info.offset or 0)
                    data_at = out.tell()
                    _copy(source, out, info.length)
            elif tensor.HasField("raw_data") and len(tensor.raw_data) >= WEIGHTS_BESIDE_BYTES:
                data_at = out.tell()
                out.write(tensor.raw_data)
                tensor.ClearField("raw_data")
            else:
                continue
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", weights.name), ("offset", data_at), ("length", out.tell() - data_at)):
                tensor.external_data.add(key=key, value=str(value))
    staged.replace(weights)
    onnx.save_model(model, str(destination))


WEIGHTS_BESIDE_BYTES = 1024
"""Smaller tensors (shapes, scalars) stay in the graph, as onnx's own conversion leaves them."""


def _tensors(graph) -> Iterator:
    """Every tensor a graph holds: its initializers and constants, and those of its subgraphs."""
    import onnx

    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            for subgraph in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                yield from _tensors(subgraph)


def _copy(source: BinaryIO, out: BinaryIO, length: int | None, chunk: int = 64 << 20) -> None:
    """`length` bytes (all that is left where None) from `source` to `out`, a chunk at a time."""
    while length is None or length > 0:
        data = source.read(chunk if length is None else min(chunk, length))
        if not data:
            break
        out.write(data)
        if length is not None:
            length -= len(data)
