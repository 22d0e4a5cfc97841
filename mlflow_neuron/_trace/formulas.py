"""The traffic formulas of the elementwise, copy, fill, reduction, softmax and matrix-product ops,
as data: which arguments an op reads, what it writes, and its FLOPs per output element. Pure.

Every formula takes a `Call` (the recorded arguments by position) and returns
`Cost(read, written, flops)`, or None when the arguments do not say enough. The rules they share:

- an op reads each tensor argument once and writes each output once (the least traffic);
- a tensor argument at a position past the op's own arguments (`ARITY`) is an `out=` tensor: it is
  written, never read, and its shape and dtype are the output's;
- a wrapped Python number (`dtypes.Tensor.wrapped`) is passed by value: not read, and it does not
  set the output's dtype (`dtypes.result_type`);
- an in-place op (`add_`) reads and writes its first argument (never a wrapped number), in its own dtype.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

from .dtypes import ELEMENT_BYTES, INTEGRAL, Tensor, category, result_type

UNARY = {"abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh",
         "sigmoid", "relu", "gelu", "silu", "erf", "reciprocal", "square", "sign", "floor", "ceil", "round",
         "hardtanh", "leaky_relu", "elu", "mish", "softplus", "clamp", "clamp_min", "clamp_max", "dropout",
         "native_dropout", "nan_to_num", "logical_not", "bitwise_not", "isnan", "threshold", "hardswish",
         "hardsigmoid", "relu6", "trunc", "frac", "sinh", "cosh", "tan", "atan", "asin", "acos", "erfinv"}  # fmt: skip
BINARY = {"add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum", "remainder", "fmod", "atan2",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "bitwise_and", "bitwise_or",
          "where", "addcmul", "addcdiv", "lerp", "masked_fill", "hypot", "copysign", "xlogy", "bitwise_xor",
          "logical_xor", "floor_divide", "true_divide"}  # fmt: skip
# Backward ops of the elementwise ones: their output has the broadcast shape of their tensor inputs.
ELEMENTWISE_BACKWARD = {"threshold_backward", "tanh_backward", "sigmoid_backward", "gelu_backward",
                        "silu_backward", "hardtanh_backward", "leaky_relu_backward", "elu_backward",
                        "softplus_backward", "hardswish_backward", "hardsigmoid_backward", "mish_backward",
                        "native_dropout_backward", "mse_loss_backward", "logit_backward"}  # fmt: skip
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
               "isnan"}  # fmt: skip
# Positional arguments of each op's functional schema, where not 1 (unary) or 2 (binary and the
# backward ops taking a gradient and one tensor): anything past these is `out=`.
ARITY = {"add": 3, "sub": 3, "rsub": 3, "where": 3, "addcmul": 4, "addcdiv": 4, "lerp": 3, "masked_fill": 3,
         "clamp": 3, "hardtanh": 3, "leaky_relu": 2, "elu": 4, "gelu": 2, "softplus": 3, "pow": 2, "dropout": 3,
         "native_dropout": 3, "nan_to_num": 4, "clamp_min": 2, "clamp_max": 2, "threshold": 3, "div": 3,
         "threshold_backward": 3, "gelu_backward": 3, "hardtanh_backward": 4, "leaky_relu_backward": 4,
         "elu_backward": 6, "softplus_backward": 4, "native_dropout_backward": 3, "mse_loss_backward": 4,
         "logit_backward": 3, "copy": 3, "clone": 2, "contiguous": 2, "_local_scalar_dense": 1, "fill": 2, "zero": 1,
         "sum": 4, "mean": 4, "all": 3, "any": 3,
         "nansum": 4, "amax": 3, "amin": 3, "logsumexp": 3, "mm": 2, "bmm": 2, "matmul": 2, "addmm": 5,
         "baddbmm": 5, "linear": 3, "softmax": 3, "_softmax": 3, "log_softmax": 3, "_log_softmax": 3,
         "_softmax_backward_data": 4, "_log_softmax_backward_data": 4}  # fmt: skip
DTYPE_FROM = {"where": (1, 2), "masked_fill": (0,)}  # operands that decide the output's dtype
# FLOPs per output element, where not 1, as the kernel writes it: mse_loss_backward is (x - y) * 2 * grad / n,
# sigmoid 1 / (1 + exp(-x)), sigmoid_backward g * (1 - y) * y, tanh_backward g * (1 - y * y).
FLOPS_PER_ELEMENT = {"mse_loss_backward": 4, "addcmul": 2, "addcdiv": 2, "lerp": 2, "gelu": 8, "gelu_backward": 8,
                     "silu": 4, "silu_backward": 5, "sigmoid": 4, "sigmoid_backward": 3, "tanh_backward": 3}  # fmt: skip
COPIES = {"copy", "clone", "contiguous", "_local_scalar_dense"}  # move bytes, compute nothing (`to` may change the dtype: its child copies)
FILLS = {"fill", "zero", "normal", "uniform", "random", "bernoulli", "exponential"}  # write only
REDUCTIONS = {"sum", "mean", "amax", "amin", "nansum", "logsumexp", "all", "any"}  # (input, dim, keepdim, ...)
ONE_DIM = {"all", "any"}  # reductions whose `dim` may be one int (a "Scalar"), not a list
# Per-element FLOPs of softmax (max, subtract, exp, sum, divide) and its backward (y * (g - sum(g * y))).
SOFTMAX = {"softmax": 5, "_softmax": 5, "log_softmax": 5, "_log_softmax": 5, "_softmax_backward_data": 4,
           "_log_softmax_backward_data": 4}  # fmt: skip
MATMULS = {"mm", "bmm", "matmul", "addmm", "baddbmm", "linear"}
SCALAR_TYPES = {"0": "unsigned char", "1": "signed char", "2": "short int", "3": "int", "4": "long int",
                "5": "c10::Half", "6": "float", "7": "double", "11": "bool", "15": "c10::BFloat16"}  # fmt: skip
_INT = re.compile(r"-?\d+")


class Cost(NamedTuple):
    read: int
    written: int
    flops: int


@dataclass(frozen=True)
class Call:
    """One call's arguments by position: a `Tensor`, a list of shapes (a TensorList, whose dtypes
    the profiler does not record), the concrete text of a scalar ("" when not recorded), or None."""

    name: str  # without `aten::` and without the in-place `_`
    in_place: bool
    args: tuple
    kinds: tuple = ()  # the recorded `Input type` of each position

    def tensor(self, i: int | None) -> Tensor | None:
        arg = self.args[i] if i is not None and i < len(self.args) else None
        return arg if isinstance(arg, Tensor) else None

    def text(self, i: int | None) -> str:
        arg = self.args[i] if i is not None and i < len(self.args) else None
        return arg.strip() if isinstance(arg, str) else ""

    def flag(self, i: int | None) -> bool | None:
        return {"True": True, "False": False, "1": True, "0": False}.get(self.text(i))

    def ints(self, i: int | None) -> list[int] | None:
        text = self.text(i)
        return [int(n) for n in _INT.findall(text)] if text and text != "None" else None

    def operands(self, arity: int) -> list[Tensor]:
        return [a for a in self.args[:arity] if isinstance(a, Tensor)]

    def out(self, arity: int) -> Tensor | None:
        return next((a for a in self.args[arity:] if isinstance(a, Tensor)), None)


def elementwise(call: Call) -> Cost | None:
    arity = ARITY.get(call.name, 1 if call.name in UNARY else 2)
    operands, out = call.operands(arity), call.out(arity)
    if not operands:
        return None
    shape = broadcast([t.shape for t in operands])
    if shape is None:
        return None
    if call.in_place:
        written = operands[0]
    elif out is not None:
        written = out
    else:
        deciding = [call.tensor(i) for i in DTYPE_FROM.get(call.name, range(arity))]
        dtype = "bool" if call.name in COMPARISONS else result_type([t for t in deciding if t is not None])
        if dtype is None:
            return None
        written = Tensor(tuple(shape), dtype)
    read = sum(t.nbytes for i, t in enumerate(operands) if not t.wrapped or (call.in_place and i == 0))
    return Cost(read, written.nbytes, FLOPS_PER_ELEMENT.get(call.name, 1) * math.prod(shape))


def copy(call: Call) -> Cost | None:
    """`copy_(self, src)` reads src and writes self; `clone`/`contiguous` read and write self."""
    if call.name == "copy" and call.in_place:
        dst, src = call.tensor(0), call.tensor(1)
        return Cost(src.nbytes, dst.nbytes, 0) if dst is not None and src is not None else None
    source, out = call.tensor(0), call.out(ARITY[call.name])
    if source is None:
        return None
    return Cost(source.nbytes, (out or source).nbytes, 0)


def fill(call: Call) -> Cost | None:
    """`fill_(self, value)`, `zero_(self)`, `normal_(self, ...)`: self written; a value given as a
    0-dim tensor (`fill_.Tensor`, `bernoulli_.Tensor`) is read."""
    target, value = call.tensor(0), call.tensor(1)
    if target is None or not call.in_place:  # `bernoulli(p)`, `normal(mean, std)`: other schemas
        return None
    return Cost(value.nbytes if value is not None and not value.wrapped else 0, target.nbytes, 0)


def reduction(call: Call) -> Cost | None:
    source = call.tensor(0)
    if source is None:
        return None
    out = call.out(ARITY[call.name])
    if out is None:
        shape = _reduced(source.shape, call)
        if shape is None:
            return None
        dtype = SCALAR_TYPES.get(call.text(3)) if call.name in ("sum", "mean", "nansum") else None
        if call.name in ONE_DIM:
            dtype = "unsigned char" if source.dtype == "unsigned char" else "bool"
        if dtype is None:
            dtype = "long int" if call.name in ("sum", "nansum") and category(source.dtype) <= INTEGRAL else source.dtype
        out = Tensor(tuple(shape), dtype)
    return Cost(source.nbytes, out.nbytes, source.numel)


def _reduced(shape: tuple, call: Call) -> list[int] | None:
    """A reduction's output: over `dim` (argument 1, a ScalarList; `[]` is every dim), kept as 1s
    with `keepdim` (argument 2); over everything for the overload without dims (`sum(x,
    dtype=None)`, `all(x)`: at most two arguments). Unknown when the dims were not recorded (no
    `Concrete Inputs`, or older torch, which records a dim list as "")."""
    if len(call.kinds) < 2 or call.kinds[1] != "ScalarList" and not (call.name in ONE_DIM and call.kinds[1] == "Scalar"):
        return [] if len(call.kinds) <= 2 else None
    dims = call.ints(1)
    if dims is None:
        return None
    dims = [d % max(len(shape), 1) for d in dims] or list(range(len(shape)))
    keep = call.flag(2) is True
    return [1 if i in dims else n for i, n in enumerate(shape) if keep or i not in dims]


def softmax(call: Call) -> Cost | None:
    """softmax(self, dim, dtype), _softmax(self, dim, half_to_float), and their backward
    (grad_output, output, dim, input_dtype): the output has the first tensor's shape."""
    operands = call.operands(2)
    if not operands:
        return None
    first = operands[0]
    out = call.out(ARITY[call.name])
    if out is None:
        if call.name.endswith("_backward_data"):
            dtype = SCALAR_TYPES.get(call.text(3))
        elif call.name.startswith("_"):
            dtype = "float" if call.flag(2) else first.dtype
        else:
            dtype = SCALAR_TYPES.get(call.text(2), first.dtype)
        if dtype is None:
            return None
        out = Tensor(first.shape, dtype)
    return Cost(sum(t.nbytes for t in operands), out.nbytes, SOFTMAX[call.name] * first.numel)


def matmul(call: Call) -> Cost | None:
    arity = ARITY[call.name]
    operands, out = call.operands(arity), call.out(arity)
    product = operands[1:3] if call.name in ("addmm", "baddbmm") else operands[:2]
    if len(product) < 2:
        return None
    found = _product(call.name, [list(t.shape) for t in product])
    if found is None:
        return None
    shape, flops = found
    dtype = out.dtype if out is not None else result_type(product)
    if dtype is None:
        return None
    return Cost(sum(t.nbytes for t in operands), math.prod(shape) * ELEMENT_BYTES[dtype], flops)


def _product(name: str, shapes: list[list[int]]) -> tuple[list[int], int] | None:
    if name == "linear":
        x, weight = shapes
        if len(weight) != 2 or not x or x[-1] != weight[1]:
            return None
        (n, k) = weight
        return [*x[:-1], n], 2 * math.prod(x[:-1]) * k * n
    if len(shapes[0]) < 2 or len(shapes[1]) < 2:
        return None
    (m, k), (k2, n) = shapes[0][-2:], shapes[1][-2:]
    batch = broadcast([shapes[0][:-2], shapes[1][:-2]])
    if k != k2 or batch is None:
        return None
    return [*batch, m, n], 2 * math.prod(batch) * m * k * n


def broadcast(shapes: list) -> list[int] | None:
    """NumPy broadcasting of the shapes; None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return out


FORMULAS: dict[str, Callable[[Call], Cost | None]] = {
    **{op: elementwise for op in UNARY | BINARY | ELEMENTWISE_BACKWARD},
    **{op: copy for op in COPIES}, **{op: fill for op in FILLS}, **{op: reduction for op in REDUCTIONS},
    **{op: softmax for op in SOFTMAX}, **{op: matmul for op in MATMULS},
}  # fmt: skip
