"""Bytes and FLOPs of one op call, from its recorded input shapes and dtypes (`record_shapes=True`). Pure.

Example::

    op_traffic("aten::add", OpInputs([[8, 1], [1, 4]], ["float", "float"]))   # (4*8 + 4*4 + 4*32, 32)

`bytes` is the least traffic the call needs: each tensor input read once, each output written once.
Outputs are not recorded, so their shapes are inferred from the inputs by op family, in the one
table below (`FAMILIES`); an op that is not in it, or whose inputs do not say enough (a reduction
without its dims), gets None: it is never guessed. FLOPs count one per output element for
elementwise ops, one per input element for reductions, 2·m·k·n for matrix products, and the
per-element counts written next to the norms and softmax.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .event_tree import EventTree
from .events import RawEvents

ELEMENT_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2, "long int": 8,
    "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}  # fmt: skip

UNARY = {"abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh",
         "sigmoid", "relu", "gelu", "silu", "erf", "reciprocal", "square", "sign", "floor", "ceil", "round",
         "hardtanh", "leaky_relu", "elu", "mish", "softplus", "clamp", "clamp_min", "clamp_max", "dropout",
         "native_dropout", "nan_to_num"}  # fmt: skip
BINARY = {"add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum", "remainder", "fmod", "atan2",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "bitwise_and", "bitwise_or",
          "where", "addcmul", "addcdiv", "lerp", "masked_fill", "hypot", "copysign", "xlogy"}  # fmt: skip
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"}
COPIES = {"copy", "clone", "contiguous"}  # move bytes, compute nothing (`to` may change the dtype: unknown)
REDUCTIONS = {"sum", "mean", "amax", "amin", "nansum", "logsumexp"}  # (input, dim, keepdim, ...)
# Per-element FLOPs of the norms and softmax (their output has the input's shape):
# rms_norm: square, add into the sum, scale by rsqrt, scale by weight; layer_norm adds the mean's
# sum and subtraction; softmax: max, subtract, exp, sum, divide.
PER_ELEMENT = {"rms_norm": 4, "layer_norm": 6, "softmax": 5, "_softmax": 5, "log_softmax": 5,
               "_log_softmax": 5}  # fmt: skip
MATMULS = {"mm", "bmm", "matmul", "addmm", "baddbmm", "linear"}
FAMILIES = {"unary": UNARY, "binary": BINARY, "copy": COPIES, "reduction": REDUCTIONS,
            "norm/softmax": set(PER_ELEMENT), "matmul": MATMULS}  # fmt: skip
_LIST = re.compile(r"-?\d+")


@dataclass(frozen=True)
class OpInputs:
    """A call's inputs as the profiler recorded them: shapes (`Input Dims`), dtypes (`Input type`:
    a dtype for a tensor, "Scalar", "ScalarList", "" for None, ...) and, where recorded, the
    scalar arguments as text (`Concrete Inputs`: "[-1]", "True", "")."""

    shapes: Sequence[Sequence[int]]
    dtypes: Sequence[str]
    concrete: Sequence[str] = ()


def op_traffic(name: str, inputs: OpInputs) -> tuple[int, int] | None:
    """(bytes, flops) of one call of `name` (ATen's, `aten::` prefixed), or None when unknown."""
    if not name.startswith("aten::"):
        return None
    base = name[len("aten::"):]
    in_place = base.endswith("_") and not base.startswith("_")
    base = base.rstrip("_") if in_place else base
    tensors = [(list(s), ELEMENT_BYTES[d]) for s, d in zip(inputs.shapes, inputs.dtypes) if d in ELEMENT_BYTES]
    if not tensors:
        return None
    out_size = tensors[0][1] if in_place else 1 if base in COMPARISONS else max(size for _, size in tensors[:2])
    if base == "copy" and in_place and len(tensors) > 1:
        tensors = tensors[1:]  # copy_(dst, src) reads only src; dst is written below
    if base in REDUCTIONS:
        tensors = tensors[:1]  # the rest is an `out=` tensor, written below
    read = sum(_numel(s) * size for s, size in tensors)
    out = _output(base, tensors, inputs)
    if out is None:
        return None
    shape, flops = out
    return read + _numel(shape) * out_size, flops


def _output(base: str, tensors: list, inputs: OpInputs) -> tuple[list[int], int] | None:
    """The output shape and FLOPs of a call, by family; None when the inputs do not say."""
    shapes = [s for s, _ in tensors]
    if base in UNARY or base in BINARY:
        shape = _broadcast(shapes)
        return (shape, _numel(shape)) if shape is not None else None
    if base in COPIES:
        return shapes[0], 0
    if base in PER_ELEMENT:
        return shapes[0], PER_ELEMENT[base] * _numel(shapes[0])
    if base in REDUCTIONS:
        shape = _reduced(shapes[0], inputs)
        return (shape, _numel(shapes[0])) if shape is not None else None
    if base in MATMULS:
        return _matmul(base, shapes)
    return None


def _reduced(shape: list[int], inputs: OpInputs) -> list[int] | None:
    """A reduction's output: over `dim` (input 1, a ScalarList; `[]` is every dim), kept as 1s with
    `keepdim` (input 2); over everything when input 1 is no dim list (`sum(x, dtype=None)`).
    Unknown when the dims were not recorded (no `Concrete Inputs`)."""
    dtypes, concrete = list(inputs.dtypes), [str(c).strip() for c in inputs.concrete]
    if len(dtypes) < 2 or dtypes[1] != "ScalarList":
        return []
    if len(concrete) < 2 or not concrete[1] or concrete[1] == "None":
        return None
    dims = [int(d) % max(len(shape), 1) for d in _LIST.findall(concrete[1])]
    keep = len(concrete) > 2 and concrete[2] == "True"
    if not dims:
        dims = list(range(len(shape)))
    return [1 if i in dims else n for i, n in enumerate(shape) if keep or i not in dims]


def _matmul(base: str, shapes: list[list[int]]) -> tuple[list[int], int] | None:
    if base in ("addmm", "baddbmm"):
        shapes = shapes[1:3]  # (bias or input, a, b): the product's operands
    if base == "linear":
        if len(shapes) < 2 or len(shapes[1]) != 2 or not shapes[0]:
            return None
        x, (n, k) = shapes[0], shapes[1]
        if x[-1] != k:
            return None
        return [*x[:-1], n], 2 * _numel(x[:-1]) * k * n
    if len(shapes) < 2 or len(shapes[0]) < 2 or len(shapes[1]) < 2:
        return None
    (m, k), (k2, n) = shapes[0][-2:], shapes[1][-2:]
    batch = _broadcast([shapes[0][:-2], shapes[1][:-2]])
    if k != k2 or batch is None:
        return None
    return [*batch, m, n], 2 * _numel(batch) * m * k * n


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    """NumPy broadcasting of the shapes; None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return out


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(n) for n in shape)


def event_traffic(raw: RawEvents, tree: EventTree, read_inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per tree row, the bytes and FLOPs of that call (NaN: unknown; 0: not an op) and its first
    tensor's dtype; None when the cycle was recorded without shapes (`read_inputs`:
    `TimelineInputs.op_inputs`)."""
    if read_inputs is None:
        return None
    order = tree.order
    ops = np.flatnonzero(tree.survivor & tree.sync_host & ~raw.is_async[order] & ~raw.is_user_annotation[order])
    calls = list(read_inputs(order[ops]))
    if not any(c is not None for c in calls):
        return None
    nbytes, flops, dtype = np.zeros(len(tree)), np.zeros(len(tree)), np.full(len(tree), "", object)
    for row, call in zip(ops.tolist(), calls):
        cost = _cost(tree.names[tree.name[row]], call)
        nbytes[row], flops[row] = cost if cost is not None else (np.nan, np.nan)
        if call is not None:
            dtype[row] = next((d for d in call.dtypes if d in ELEMENT_BYTES), "")
    return nbytes, flops, dtype


def _cost(name: str, call: OpInputs | None) -> tuple[int, int] | None:
    """`op_traffic`, with recorded arguments it cannot read (another torch's layout) as unknown."""
    if call is None:
        return None
    try:
        return op_traffic(name, call)
    except (TypeError, ValueError, IndexError):
        return None


def traffic_by_name(traffic: tuple[np.ndarray, ...], rows: np.ndarray,
                    name: np.ndarray, names: list[str]) -> tuple[tuple[str, float, float, str], ...]:  # fmt: skip
    """(op name, bytes, FLOPs, dtype) summed over its calls among `rows`; NaN where one call is
    unknown; the dtype its calls share ("" when they differ)."""
    nbytes, flops, dtype = traffic[0][rows], traffic[1][rows], traffic[2][rows]
    ids = name[rows]
    found = []
    for k in np.unique(ids).tolist():
        mine = ids == k
        kinds = set(dtype[mine].tolist())
        found.append((names[k], float(nbytes[mine].sum()), float(flops[mine].sum()), kinds.pop() if len(kinds) == 1 else ""))
    return tuple(found)
