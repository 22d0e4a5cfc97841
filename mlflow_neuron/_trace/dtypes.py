"""Element sizes and PyTorch's type promotion, for the dtype names the profiler records. Pure.

Example::

    result_type([Tensor((4, 4096), "c10::BFloat16"), Tensor((), "double")])   # "c10::BFloat16"

A Python number passed where an op takes a tensor (`x.mul(2.0)`, `x + 1`) is recorded as a 0-dim
tensor of dtype `double` or `long int` (`long` in older torch: int64 either way), a "wrapped
number". It is passed to the kernel by value: it is never read from memory, and it never sets the
output's dtype unless its category (bool < integer < floating < complex) is higher than every
tensor's. A real 0-dim tensor looks the same in the record; where the difference would change the
result (an integer tensor times a 0-dim `double`: float32 if wrapped, float64 if a tensor), the
result is unknown.

Promotion follows `c10::promoteTypes` and ATen's `result_type` (dimensioned tensors, then 0-dim
ones, then wrapped numbers, each group promoted within itself and combined by category).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ELEMENT_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2, "long int": 8, "long": 8,
    "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
}  # fmt: skip
# Input types that are not tensors (a dtype name not here and not in ELEMENT_BYTES is a tensor of an
# unknown dtype: its call's numbers are unknown).
NOT_TENSORS = frozenset({"", "Scalar", "ScalarList", "TensorList", "GenericList", "String", "Device", "Layout",
                         "ScalarType", "MemoryFormat", "Generator", "Storage", "None"})  # fmt: skip
WRAPPED = frozenset({"double", "long int", "long"})  # what a Python float / int becomes as a 0-dim tensor
BOOL, INTEGRAL, FLOATING, COMPLEX = 0, 1, 2, 3
_INTEGERS = {"unsigned char": (1, False), "signed char": (1, True), "short int": (2, True), "int": (4, True),
             "long int": (8, True), "long": (8, True)}  # fmt: skip
_FLOAT_RANK = {"c10::Float8_e4m3fn": 0, "c10::Float8_e5m2": 0, "c10::Float8_e4m3fnuz": 0, "c10::Float8_e5m2fnuz": 0,
               "c10::Half": 1, "Half": 1, "c10::BFloat16": 1, "BFloat16": 1, "float": 2, "double": 3}  # fmt: skip
DEFAULT_FLOAT = "float"  # torch.get_default_dtype() of nearly every program: a wrapped Python float's dtype


@dataclass(frozen=True)
class Tensor:
    """A recorded tensor argument."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(int(n) for n in self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ELEMENT_BYTES[self.dtype]

    @property
    def wrapped(self) -> bool:
        """A 0-dim `double`/`long int`: taken for a Python number, passed by value (see above)."""
        return not self.shape and self.dtype in WRAPPED


def category(dtype: str) -> int:
    if dtype == "bool":
        return BOOL
    if dtype in _INTEGERS:
        return INTEGRAL
    return COMPLEX if dtype.startswith("c10::complex") else FLOATING


def promote_types(a: str | None, b: str | None) -> str | None:
    """`torch.promote_types` of two dtype names (None: undefined); raises ValueError where torch
    has no answer or this table does not (float8 mixes, complex with other widths)."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        higher, lower = (a, b) if ca > cb else (b, a)
        if max(ca, cb) == COMPLEX and category(lower) == FLOATING and _FLOAT_RANK[lower] > 2:
            return "c10::complex<double>"
        return higher
    if ca == INTEGRAL:
        (wa, sa), (wb, sb) = _INTEGERS[a], _INTEGERS[b]
        if sa == sb:
            return a if wa > wb else b
        unsigned, signed = (a, b) if not sa else (b, a)
        wide = max(wa, wb) if _INTEGERS[signed][0] > _INTEGERS[unsigned][0] else 2 * _INTEGERS[unsigned][0]
        return {2: "short int", 4: "int", 8: "long int"}[wide]
    if ca == FLOATING:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra == rb:
            if ra == 0:
                raise ValueError(f"torch does not promote {a} with {b}")
            return "float"  # half with bfloat16
        if min(ra, rb) == 0:
            raise ValueError(f"torch does not promote {a} with {b}")
        return a if ra > rb else b
    raise ValueError(f"no promotion of {a} with {b} here")


def result_type(tensors: list[Tensor]) -> str | None:
    """The dtype ATen's `result_type` gives these operands; None where the record cannot say
    (see the module docstring)."""
    dim = zero = wrapped = None
    ambiguous = False
    for t in tensors:
        if t.shape:
            dim = promote_types(dim, t.dtype)
        elif t.wrapped:
            ambiguous = ambiguous or t.dtype == "double"
            wrapped = promote_types(wrapped, DEFAULT_FLOAT if t.dtype == "double" else t.dtype)
        else:
            zero = promote_types(zero, t.dtype)
    if ambiguous and all(group is None or category(group) < FLOATING for group in (dim, zero)):
        return None  # a 0-dim double decides: float32 if it was a Python float, float64 if a tensor
    return _combine(dim, _combine(zero, wrapped))


def _combine(higher: str | None, lower: str | None) -> str | None:
    """ATen's `combine_categories`: the higher-priority group wins unless the lower one's category
    is higher."""
    if higher is None:
        return lower
    if lower is None or category(higher) == COMPLEX:
        return higher
    if category(lower) == COMPLEX:
        return lower if category(higher) != FLOATING else promote_types(higher, "c10::complex<float>")
    if category(higher) == FLOATING:
        return higher
    if higher == "bool" or category(lower) == FLOATING:
        return promote_types(higher, lower)
    return higher
