"""Token-wise ops on the real tokens only: a padded batch's GEMMs skip its padding.

An encoder layer spends most of its time in ops that treat each token on its own (the projections, the
feed-forward, LayerNorm, the activations); only attention needs the [batch, sequence] layout. A batch of
queries is a third padding or more (16 queries of 4-16 tokens pad to the longest), and every padded row
costs as much as a real one. So the graph (onnxruntime's fused ONNX graph, `unpad_onnx`; the OpenVINO IR,
`unpad_openvino`) gathers the real tokens' rows, after the embeddings, into [tokens, width] (onnxruntime) or
[1, tokens, width] (OpenVINO), runs the token-wise ops on them, and scatters them back to [batch, sequence, width]
only where an op needs that layout (attention's input, pooling, a per-token output), with zeros at the padded rows
(`_masked` says where those must keep what the graph put there). The graph's inputs and outputs are unchanged, so
runtimes and the parity check see the same contract.

Measured on all-MiniLM-L6-v2, onnxruntime fp32, one thread (2-core EPYC, AVX2): 16 queries of 4-16 tokens
(64% real) 73 -> 52 ms (1.42x), 8 passages of 30-128 tokens (61% real) 1.48x, one unpadded row unchanged.

In onnxruntime's graph the rows are two-axis where every op of the region takes that (`_runs_flat`): onnxruntime
then fuses each projection with its bias into one Gemm, and no axis is added and taken away around each layer.
With the [batch, sequence, -1] layout made once rather than per scatter, all-MiniLM-L6-v2's session runs 108 ops
rather than 150: a lone query took 3.67 against 3.80 ms on both cores, 5.63 against 5.72 on one (medians of 10
alternating processes, 2-core AVX2 EPYC); 16 padded queries as before. What is left of a lone query is its GEMMs.

The real tokens are where attention_mask is 1, and for a ColBERT model that scores its query expansion tokens
without attending to them (mask 0), those tokens too (`scored_unattended`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from encoderrt.compile.source import SourceModel

log = logging.getLogger("encoderrt.compile")

MASK_INPUT = "attention_mask"
IDS_INPUT = "input_ids"
UNPADDED = "UnpaddedMatMul"
"""The manifest's fused_ops key: how many MatMuls run on the real tokens only."""
PREFIX = "unpad/"
"""The real-token rows of a tensor are its name under this prefix."""
INDEX = "unpad_index/"
"""The rewrite's own tensors: where the real tokens are (made once from the mask), and each gather's and scatter's
steps."""

_TOKEN_WISE = {
    # elementwise: every non-constant input holds token rows, constants broadcast over the tokens
    "Add", "Sub", "Mul", "Div", "Pow", "Cast", "Erf", "Tanh", "Sigmoid", "Relu", "Sqrt", "Neg", "Softplus", "Identity",
    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd",
    # normalisation over the last axis
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    # a projection: token rows times a constant matrix
    "MatMul",
}


def scored_unattended(source: SourceModel) -> int | None:
    """The token id of rows that are scored though the mask leaves them out (a ColBERT query's expansion tokens, where
    the model does not attend to them): those rows count as real too. None: the mask says which rows are real."""
    rules = source.multi_vector
    if rules is not None and rules.expansion_length and not rules.expansion_attend:
        return rules.expansion_token_id
    return None


def unpad_onnx(model: Any, scored_id: int | None = None) -> int:
    """Rewrite `model` (an onnx ModelProto, its weights loaded or not) in place; returns how many MatMuls now run
    on the real tokens only (0: the graph is left as it was). `scored_id`: scored_unattended's."""
    graph = model.graph
    if MASK_INPUT not in {i.name for i in graph.input}:
        return 0
    constants = _constants(graph)
    nodes, outputs = list(graph.node), lambda node: [name for name in node.output if name]
    all_rows = _token_rows(model)
    masked = _masked(nodes, MASK_INPUT, _inputs, outputs, lambda node: node.op_type, constants.__contains__,
                     all_rows.__contains__)
    rows = all_rows - masked  # a token-wise op's every input is a row tensor or a constant: none past the mask
    region = _region(nodes, lambda node: _is_token_wise(node, rows, constants), _inputs, outputs,
                     lambda node: node.op_type == "MatMul")
    if not region:
        return 0
    _rewrite(graph, region, rows, scored_id, _runs_flat(region, constants))
    return sum(node.op_type == "MatMul" for node in region)


def _constants(graph) -> dict[str, tuple[int, ...]]:
    """Initializers and Constant nodes' outputs, by name, with their shapes."""
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    shapes[node.output[0]] = tuple(attribute.t.dims)
                elif attribute.name in ("value_float", "value_int"):
                    shapes[node.output[0]] = ()
    return shapes


def _broadcasts_over_tokens(shape: tuple[int, ...]) -> bool:
    """A constant that, broadcast against [batch, sequence, width], is the same for every token."""
    return len(shape) <= 1 or (len(shape) <= 3 and all(d == 1 for d in shape[:len(shape) - 1]))


def _inputs(node) -> list[str]:
    return [name for name in node.input if name]


def _is_token_wise(node, rows: set[str], constants: dict[str, tuple[int, ...]]) -> bool:
    if node.op_type not in _TOKEN_WISE or node.domain not in ("", "ai.onnx", "com.microsoft"):
        return False
    inputs = _inputs(node)
    if node.op_type == "MatMul":
        return inputs[0] in rows and len(constants.get(inputs[1], ())) == 2
    if node.op_type in ("LayerNormalization", "SimplifiedLayerNormalization"):
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if axis not in (-1, 2):
            return False
    if not any(name in rows for name in inputs):
        return False
    return all(name in rows or (name in constants and _broadcasts_over_tokens(constants[name])) for name in inputs)


def _token_rows(model) -> set[str]:
    """The [batch, sequence, width] tensors, by onnxruntime's symbolic shape inference (which knows its contrib ops)
    on a copy whose weights are inputs of their shape: nothing is read from disk."""
    import onnx
    from onnx.external_data_helper import uses_external_data
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    shapes_only = onnx.ModelProto()
    shapes_only.CopyFrom(model)
    graph = shapes_only.graph
    tensors = list(graph.initializer)
    weight = [uses_external_data(t) or len(t.raw_data) > _WEIGHT_BYTES for t in tensors]
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t, is_weight in zip(tensors, weight) if is_weight)
    kept = [t for t, is_weight in zip(tensors, weight) if not is_weight]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    try:
        inferred = SymbolicShapeInference.infer_shapes(shapes_only, auto_merge=True)
    except Exception as exc:  # noqa: BLE001 - an op it cannot follow leaves the graph padded, as before
        log.info("token rows unknown (%s: %s): the graph keeps its padding", type(exc).__name__, exc)
        return set()
    mask = next(i for i in inferred.graph.input if i.name == MASK_INPUT)
    batch, sequence = (d.dim_param or d.dim_value for d in mask.type.tensor_type.shape.dim)
    rows = set()
    for value in (*inferred.graph.value_info, *inferred.graph.output):
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        if len(dims) == 3 and dims[0] == batch and dims[1] == sequence and dims[0] and dims[1]:
            rows.add(value.name)
    return rows


_WEIGHT_BYTES = 4096
"""Tensors larger than this are weights to shape inference: only their shapes matter."""


def _masked(nodes: list, mask: Hashable, inputs: Callable[[Any], list], outputs: Callable[[Any], list],
            kind: Callable[[Any], str], constant: Callable[[Hashable], bool], rows: Callable[[Hashable], bool]) -> set:
    """The tensors whose padded rows hold what the mask put there: the mask's own values (through casts, reshapes and
    arithmetic), an op applying them to other tensors (mean pooling's product, SPLADE's masked logits, DeBERTa's
    masked embeddings), and what follows from those alone. A token-wise op there must see the padded rows as the
    graph made them: log1p of a masked logit is 0 at a padded row, of the zero a scatter leaves there log(0).

    Once a tensor whose padded rows are arbitrary joins in (attention's output: a padded query's row, which no
    output reads), its padded rows are arbitrary again, and zeros are as good as any."""
    values, masked = {mask}, set()
    for node in nodes:
        names = [name for name in inputs(node) if not constant(name)]
        if kind(node) in _ATTENTION or not names:
            continue
        if kind(node) in _MASK_VALUE_OPS and all(name in values for name in names):
            values.update(outputs(node))
        elif any(name in values for name in names) or (
                any(name in masked for name in names) and not any(rows(n) and n not in masked for n in names)):
            masked.update(outputs(node))
    return values | masked


def _region(nodes: list, token_wise: Callable[[Any], bool], inputs: Callable[[Any], Iterable[Hashable]],
            outputs: Callable[[Any], Iterable[Hashable]], worth_it: Callable[[Any], bool]) -> list:
    """The token-wise nodes worth gathering for: connected groups of them (through the token rows they pass each
    other) that hold a node `worth_it` (a projection); alone, the copies would cost more than they save."""
    chosen = [node for node in nodes if token_wise(node)]
    parent = list(range(len(chosen)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer = {name: i for i, node in enumerate(chosen) for name in outputs(node)}
    for i, node in enumerate(chosen):
        for name in inputs(node):
            if name in producer:
                parent[find(i)] = find(producer[name])
    worth = {find(i) for i, node in enumerate(chosen) if worth_it(node)}
    return [node for i, node in enumerate(chosen) if find(i) in worth]


_FLAT_UNSAFE = {"BiasAdd"}
"""Token-wise ops whose kernels take [batch, sequence, channels] only (BiasAdd: onnxruntime's CUDA kernel)."""
_LAST_AXIS_OPS = {"LayerNormalization", "SimplifiedLayerNormalization"}


def _runs_flat(region: list, constants: dict[str, tuple[int, ...]]) -> bool:
    """Whether the region can run on [tokens, width] rows: no op in it needs three axes, and no constant it
    broadcasts has three (which would give its rows a leading axis back)."""
    return not any(node.op_type in _FLAT_UNSAFE or any(len(constants.get(name, ())) > 2 for name in _inputs(node))
                   for node in region)


def _rewrite(graph, region: list, rows: set[str], scored_id: int | None, flat: bool) -> None:
    """Gather the region's inputs into real-token rows, rename what it makes, scatter back what leaves it.
    `flat`: the rows are [tokens, width] (`_runs_flat`), else [1, tokens, width]."""
    import onnx
    from onnx import helper

    inside = {id(node) for node in region}
    made_inside = {name for node in region for name in node.output if name}
    entering = {name for node in region for name in _inputs(node) if name in rows and name not in made_inside}
    used_outside = {name for node in graph.node if id(node) not in inside for name in _inputs(node)}
    leaving = {name for name in made_inside if name in used_outside} | (made_inside & {o.name for o in graph.output})

    def packed(name: str) -> str:
        return PREFIX + name

    def const(name: str, values: list[int]) -> Any:
        return helper.make_node("Constant", [], [INDEX + name], value=helper.make_tensor(
            INDEX + name, onnx.TensorProto.INT64, [len(values)], values))

    i_ = INDEX
    index = [
        const("flat", [-1]), const("zero", [0]), const("one", [1]), const("pad_row", [0, 0, 1, 0]),
        helper.make_node("Reshape", [MASK_INPUT, i_ + "flat"], [i_ + "mask"]),
        helper.make_node("Cast", [i_ + "mask"], [i_ + "masked"], to=onnx.TensorProto.BOOL),
        *([helper.make_node("Identity", [i_ + "masked"], [i_ + "attended"])] if scored_id is None else [
            const("scored_id", [scored_id]),  # rows of this id count too
            helper.make_node("Reshape", [IDS_INPUT, i_ + "flat"], [i_ + "ids"]),
            helper.make_node("Equal", [i_ + "ids", i_ + "scored_id"], [i_ + "scored"]),
            helper.make_node("Or", [i_ + "masked", i_ + "scored"], [i_ + "attended"]),
        ]),
        helper.make_node("Cast", [i_ + "attended"], [i_ + "mask64"], to=onnx.TensorProto.INT64),
        helper.make_node("NonZero", [i_ + "mask64"], [i_ + "nonzero"]),
        helper.make_node("Squeeze", [i_ + "nonzero", i_ + "zero"], [i_ + "rows"]),  # [tokens]: where each real row is
        helper.make_node("CumSum", [i_ + "mask64", i_ + "zero"], [i_ + "counted"]),
        helper.make_node("Sub", [i_ + "counted", i_ + "one"], [i_ + "position"]),
        helper.make_node("ReduceSum", [i_ + "mask64", i_ + "zero"], [i_ + "tokens"], keepdims=1),
        # [batch * sequence]: each padded position's real row, or the zero row past the last
        helper.make_node("Where", [i_ + "attended", i_ + "position", i_ + "tokens"], [i_ + "scatter"]),
        # [batch, sequence, -1]: where a scattered tensor goes back to, its width inferred (one for every scatter)
        helper.make_node("Shape", [MASK_INPUT], [i_ + "batch_sequence"]),
        helper.make_node("Concat", [i_ + "batch_sequence", i_ + "flat"], [i_ + "layout"], axis=0),
    ]
    def step(name: str, what: str) -> str:  # a gather's or scatter's own intermediate tensors
        return f"{INDEX}{what}:{name}"

    def rows_of(name: str) -> str:  # a tensor's real-token rows as [tokens, width]
        return packed(name) if flat else step(name, "rows")

    gathers = {name: [
        helper.make_node("Flatten", [name], [step(name, "flat")], axis=2),
        helper.make_node("Gather", [step(name, "flat"), i_ + "rows"], [rows_of(name)], axis=0),
        *([] if flat else [helper.make_node("Unsqueeze", [rows_of(name), i_ + "zero"], [packed(name)])]),
    ] for name in entering}
    scatters = {name: [
        *([] if flat else [helper.make_node("Squeeze", [packed(name), i_ + "zero"], [rows_of(name)])]),
        helper.make_node("Pad", [rows_of(name), i_ + "pad_row"], [step(name, "padded_rows")]),
        helper.make_node("Gather", [step(name, "padded_rows"), i_ + "scatter"], [step(name, "flat")], axis=0),
        helper.make_node("Reshape", [step(name, "flat"), i_ + "layout"], [name]),
    ] for name in leaving}
    if flat:  # a LayerNorm over axis 2 of [1, tokens, width] is over axis 1, the last, of [tokens, width]
        for node in region:
            if node.op_type in _LAST_AXIS_OPS:
                for attribute in node.attribute:
                    if attribute.name == "axis" and attribute.i == 2:
                        attribute.i = -1
    for node in region:
        for i, name in enumerate(node.input):
            if name in made_inside or name in entering:
                node.input[i] = packed(name)
        for i, name in enumerate(node.output):
            if name:
                node.output[i] = packed(name)
    ordered = list(index)  # the graph's inputs come first: a tensor entering the region is made by a node
    for node in graph.node:
        ordered.append(node)
        for name in node.output:
            if id(node) in inside:
                ordered += scatters.get(name[len(PREFIX):], [])
            else:
                ordered += gathers.get(name, [])
    del graph.node[:]
    graph.node.extend(ordered)


_ATTENTION = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "EmbedLayerNormalization",
              "ScaledDotProductAttention"}
"""Ops that take the mask and leave a padded row's state unread (onnxruntime's, OpenVINO's)."""
_MASK_VALUE_OPS = {
    "Cast", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Sub", "Mul", "Add", "Div", "Neg", "Not", "Equal", "Less",
    "Greater", "Where", "Identity", "Tile",  # onnx
    "Convert", "Broadcast", "Subtract", "Multiply", "Divide", "Negative", "LogicalNot", "Select",  # OpenVINO
}
"""Ops through which the mask stays the mask's values (not positions or lengths: CumSum, Gather and ReduceSum)."""

_OV_TOKEN_WISE = {"Add", "Subtract", "Multiply", "Divide", "Power", "Sqrt", "Convert", "Erf", "Tanh", "Sigmoid",
                  "Relu", "Swish", "Gelu", "Negative", "SoftPlus", "HSwish", "Clamp", "MatMul", "MVN", "ReduceMean",
                  "ReduceSum"}
_OV_LAST_AXIS = {"MVN", "ReduceMean", "ReduceSum"}
"""Ops over the axes their second input names: token-wise when that is the last axis alone (LayerNorm, RMSNorm)."""


OV_ROW_BUCKET = 16
"""The OpenVINO graph's real-token rows are this many at a time (the first real row repeated up to the next
multiple), so that batches of nearby sizes share every internal shape. OpenVINO's CPU plugin prepares each node for
every new shape it meets: lone queries of 4-16 tokens, each of another length, ran 2.7 ms a query against 1.7 ms
for one shape over and over (bf16 all-MiniLM-L6-v2, 2-core Sapphire Rapids). Sixteen rows is one AMX tile's
height, so a short query's GEMMs cost what its own rows would; the backend pads the batch's width to a multiple
(runtime/backends/openvino.py), which fixes the shapes the rows are scattered back to."""


def unpad_openvino(model: Any, scored_id: int | None = None) -> int:
    """The same rewrite on an OpenVINO model (in place), whose token rows are found by OpenVINO's own shape
    inference: the [batch, sequence] inputs get a symbol per dimension and every tensor carrying both is a row
    tensor. Returns how many MatMuls now run on the real tokens only."""
    import openvino as ov

    inputs = {p.get_output_tensor(0).get_any_name(): p for p in model.get_parameters()}
    if MASK_INPUT not in inputs:
        return 0
    batch, sequence = ov.Symbol(), ov.Symbol()
    shapes = {name: p.get_partial_shape() for name, p in inputs.items() if p.get_partial_shape().rank.get_length() == 2}
    for name in shapes:
        dims = [ov.Dimension(), ov.Dimension()]
        dims[0].set_symbol(batch)
        dims[1].set_symbol(sequence)
        inputs[name].set_partial_shape(ov.PartialShape(dims))
    model.validate_nodes_and_infer_types()

    nodes = list(model.get_ordered_ops())
    constants = {_ov_key(node.output(0)) for node in nodes if _ov_constant(node.output(0)) is not None}
    row_tensors = {_ov_key(output) for node in nodes for output in node.outputs() if _ov_rows(output, batch, sequence)}
    masked = _masked(nodes, _ov_key(inputs[MASK_INPUT].output(0)), _ov_inputs, _ov_outputs,
                     lambda node: node.get_type_name(), constants.__contains__, row_tensors.__contains__)
    row_tensors -= masked

    def rows(output) -> bool:
        return _ov_key(output) in row_tensors

    try:
        region = _region(nodes, lambda node: _ov_token_wise(node, rows), _ov_inputs, _ov_outputs,
                         lambda node: node.get_type_name() == "MatMul")
        if region:
            _ov_rewrite(region, rows, inputs[MASK_INPUT], inputs.get(IDS_INPUT) if scored_id is not None else None,
                        scored_id)
    finally:
        for name, shape in shapes.items():  # the symbols were for finding the rows only
            inputs[name].set_partial_shape(shape)
        model.validate_nodes_and_infer_types()
    return sum(node.get_type_name() == "MatMul" for node in region)


def _ov_rows(output, batch: Any, sequence: Any) -> bool:
    shape = output.get_partial_shape()
    return (shape.rank.is_static and shape.rank.get_length() == 3 and shape[0].get_symbol() == batch
            and shape[1].get_symbol() == sequence)


def _ov_key(output) -> tuple[str, int]:
    return output.get_node().get_name(), output.get_index()


def _ov_inputs(node) -> list[tuple[str, int]]:
    return [_ov_key(node.input_value(i)) for i in range(node.get_input_size())]


def _ov_outputs(node) -> list[tuple[str, int]]:
    return [_ov_key(output) for output in node.outputs()]


def _ov_constant(output) -> Any:
    """The Constant behind `output` (through a decompressing Convert), or None."""
    node = output.get_node()
    while node.get_type_name() == "Convert" and node.input_value(0).get_node().get_type_name() == "Constant":
        node = node.input_value(0).get_node()
    return node if node.get_type_name() == "Constant" else None


def _ov_token_wise(node, rows: Callable[[Any], bool]) -> bool:
    kind = node.get_type_name()
    if kind not in _OV_TOKEN_WISE or not all(rows(output) for output in node.outputs()):
        return False
    values = [node.input_value(i) for i in range(node.get_input_size())]
    if kind == "MatMul":
        weight = _ov_constant(values[1])
        return rows(values[0]) and weight is not None and len(weight.get_output_shape(0)) == 2
    if kind in _OV_LAST_AXIS:
        axes = _ov_constant(values[1])
        if axes is None or [int(a) for a in axes.get_data().ravel()] not in ([-1], [2]):
            return False
        values = values[:1]
    if not any(rows(value) for value in values):
        return False
    constants = [_ov_constant(value) for value in values if not rows(value)]
    return all(c is not None and _broadcasts_over_tokens(tuple(c.get_output_shape(0))) for c in constants)


def _ov_rewrite(region: list, rows: Callable[[Any], bool], mask: Any, ids: Any, scored_id: int | None) -> None:
    import numpy as np
    import openvino.opset15 as ops

    def i64(values):
        return ops.constant(np.array(values, np.int64))

    flat_mask = ops.reshape(mask, i64([-1]), special_zero=False)
    attended = ops.convert(flat_mask, "boolean")
    if ids is not None:  # rows of scored_id count too
        flat_ids = ops.reshape(ids, i64([-1]), special_zero=False)
        attended = ops.logical_or(attended, ops.equal(flat_ids, ops.constant(np.array(scored_id, np.int64))))
    ones = ops.convert(attended, "i64")
    real = ops.squeeze(ops.non_zero(ones, "i64"), i64([0]))  # [tokens]: where each real row is
    # [rows]: those, then the first again up to a multiple of OV_ROW_BUCKET; the repeats compute what it computes
    tokens = ops.reduce_sum(ones, i64([0]), keep_dims=True)
    rows_count = ops.multiply(ops.divide(ops.add(tokens, i64([OV_ROW_BUCKET - 1])), i64([OV_ROW_BUCKET])),
                              i64([OV_ROW_BUCKET]))
    repeats = ops.broadcast(ops.gather(real, i64([0]), i64(0)), ops.subtract(rows_count, tokens))
    real_rows = ops.concat([real, repeats], 0)
    # [batch * sequence]: each position's real row, or for padding the zero row past the last
    scatter_rows = ops.select(attended, ops.subtract(ops.cumsum(ones, i64(0)), i64([1])), rows_count)
    batch_sequence = ops.shape_of(mask, "i64")

    def width(output):
        return ops.gather(ops.shape_of(output, "i64"), i64([2]), i64(0))

    def gather(output):
        flat = ops.reshape(output, ops.concat([i64([-1]), width(output)], 0), special_zero=False)
        return ops.unsqueeze(ops.gather(flat, real_rows, i64(0)), i64([0])).output(0)

    def scatter(output):
        padded = ops.pad(ops.squeeze(output, i64([0])), i64([0, 0]), i64([1, 0]), "constant")
        flat = ops.gather(padded, scatter_rows, i64(0))
        return ops.reshape(flat, ops.concat([batch_sequence, width(output)], 0), special_zero=False).output(0)

    inside = {node.get_name() for node in region}
    gathered: dict[tuple[str, int], Any] = {}
    for node in region:
        for i in range(node.get_input_size()):
            value = node.input_value(i)
            if rows(value) and value.get_node().get_name() not in inside:
                if _ov_key(value) not in gathered:
                    gathered[_ov_key(value)] = gather(value)
                node.input(i).replace_source_output(gathered[_ov_key(value)])
    for node in region:
        for output in node.outputs():
            outside = [target for target in output.get_target_inputs() if target.get_node().get_name() not in inside]
            if outside:
                scattered = scatter(output)
                for target in outside:
                    target.replace_source_output(scattered)
