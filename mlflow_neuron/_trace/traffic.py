"""Bytes and FLOPs of one op call, from its recorded input shapes and dtypes (`record_shapes=True`). Pure.

Example::

    op_traffic("aten::add", OpInputs([[8, 1], [1, 4]], ["float", "float"]))   # (4*8 + 4*4 + 4*32, 32)
    op_traffic("aten::mul", OpInputs([[4, 4096], []], ["float", "double"]))  # (131072, 16384): 2.0 is not read

`bytes` is the least traffic the call needs: each tensor input read once, each output written once.
Outputs are not recorded, so their shapes and dtypes are inferred from the inputs, op by op, in the
tables of `formulas` (elementwise, copies, reductions, softmax, matrix products) and `formulas_nn`
(norms, losses, embeddings, attention, convolution), with PyTorch's type promotion (`dtypes`). An op
that is not in them, or whose recorded arguments do not say enough (a reduction without its dims, a
TensorList, whose dtypes torch does not record), gets None: it is never guessed.

A collective (`record_param_comms`, which launches the NCCL/RCCL kernel) gets its message size
instead, apart: it is link traffic, not HBM traffic. The size is `max(In msg nelems, Out msg
nelems)` times the element size (the args newer torch writes on the event; nccl-tests' "size"),
or, in older traces, the bytes of the tensor recorded on its `nccl:all_reduce` / `nccl:all_to_all`
/ ... range, for the collectives whose message is their input. Else it is unknown.

`coverage` says how much of a cycle's device time those numbers cover: the share of the kernel time
of the ops that launched it (each kernel counted once, on its innermost op) whose op has bytes or,
for a collective, a message size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .dtypes import ELEMENT_BYTES, NOT_TENSORS, Tensor
from .event_tree import EventTree
from .events import RawEvents
from .formulas import BINARY, COPIES, FILLS, FORMULAS, MATMULS, REDUCTIONS, SOFTMAX, UNARY, ELEMENTWISE_BACKWARD, Call
from .formulas_nn import ATTENTION, CONVOLUTIONS, FORMULAS_NN, NORM_BACKWARDS, NORMS

FAMILIES = {"unary": UNARY, "binary": BINARY, "elementwise backward": ELEMENTWISE_BACKWARD, "copy": COPIES,
            "fill": FILLS, "reduction": REDUCTIONS, "softmax": set(SOFTMAX), "matmul": MATMULS, "norm": set(NORMS),
            "norm backward": set(NORM_BACKWARDS), "attention": set(ATTENTION), "convolution": set(CONVOLUTIONS),
            "loss/embedding": set(FORMULAS_NN) - set(NORMS) - set(NORM_BACKWARDS) - set(ATTENTION) - set(CONVOLUTIONS)}  # fmt: skip
_ALL = {**FORMULAS, **FORMULAS_NN}
UNCOVERED_SHOWN = 5  # the largest ops without bytes that `coverage` names


@dataclass(frozen=True)
class OpInputs:
    """A call's inputs as the profiler recorded them: shapes (`Input Dims`), dtypes (`Input type`:
    a dtype for a tensor, "Scalar", "ScalarList", "" for None, ...) and, where recorded, the
    scalar arguments as text (`Concrete Inputs`: "[-1]", "True", "")."""

    shapes: Sequence[Sequence[int]]
    dtypes: Sequence[str]
    concrete: Sequence[str] = ()
    message_bytes: int | None = None  # a collective's, from the event's args (`message_bytes`)


COLLECTIVE = "record_param_comms"
# Older torch's range around a collective, whose recorded tensor is the whole message: the input of
# an all-reduce, a broadcast, a reduce, a send or receive, and an all-to-all's send buffer (not an
# all-gather's or a reduce-scatter's, whose message is another size).
MESSAGE_RANGES = frozenset({"nccl:all_reduce", "nccl:all_to_all", "nccl:broadcast", "nccl:reduce", "nccl:send",
                            "nccl:recv"})  # fmt: skip
# The dtype names newer torch writes in a collective's args (c10::ScalarType names).
MESSAGE_DTYPES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                  "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1,
                  "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1}  # fmt: skip


def message_bytes(args: dict) -> int | None:
    """A collective's message size from its event's args (`In msg nelems`, `Out msg nelems`,
    `dtype`), or None when they are missing or of an unknown dtype."""
    sizes = [args.get("In msg nelems"), args.get("Out msg nelems")]
    size = MESSAGE_DTYPES.get(str(args.get("dtype")))
    if size is None or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        return None
    return max(sizes) * size


def op_traffic(name: str, inputs: OpInputs) -> tuple[int, int] | None:
    """(bytes, flops) of one call of `name` (ATen's, `aten::` prefixed), or None when unknown."""
    call = _call(name, inputs)
    if call is None:
        return None
    formula = _ALL.get(call.name)
    cost = formula(call) if formula is not None else None
    return (cost.read + cost.written, cost.flops) if cost is not None else None


def _call(name: str, inputs: OpInputs) -> Call | None:
    """The call's arguments by position; None for a range, or a tensor of a dtype not known here."""
    if not name.startswith("aten::"):
        return None
    base = name[len("aten::"):]
    in_place = base.endswith("_") and not base.startswith("_") or base.startswith("_foreach_") and base.endswith("_")
    base = base[:-1] if in_place else base
    concrete = list(inputs.concrete)
    args = []
    for i, (shape, dtype) in enumerate(zip(inputs.shapes, inputs.dtypes)):
        text = str(concrete[i]) if i < len(concrete) and concrete[i] is not None else ""
        if dtype in ELEMENT_BYTES:
            args.append(Tensor(tuple(int(n) for n in shape), dtype))
        elif dtype == "TensorList":
            args.append([list(s) for s in shape])
        elif dtype in NOT_TENSORS:
            args.append(text if dtype else None)
        else:
            return None
    return Call(base, in_place, tuple(args), tuple(inputs.dtypes))


def event_traffic(raw: RawEvents, tree: EventTree, read_inputs) -> tuple[np.ndarray, ...] | None:
    """Per tree row, the bytes and FLOPs of that call (NaN: unknown; 0: not an op), its first
    tensor's dtype and a collective's message size (NaN: not a collective, or unknown); None when
    the cycle was recorded without shapes (`read_inputs`: `TimelineInputs.op_inputs`)."""
    if read_inputs is None:
        return None
    order = tree.order
    ops = np.flatnonzero(tree.survivor & tree.sync_host & ~raw.is_async[order] & ~raw.is_user_annotation[order])
    calls = list(read_inputs(order[ops]))
    if not any(c is not None for c in calls):
        return None
    nbytes, flops, dtype = np.zeros(len(tree)), np.zeros(len(tree)), np.full(len(tree), "", object)
    message = np.full(len(tree), np.nan)
    known: dict = {}  # (name, its recorded arguments) -> (bytes, FLOPs, dtype): a step's calls repeat, layer after layer
    found = []
    for row, name, call in zip(ops.tolist(), tree.name[ops].tolist(), calls):
        # repr: the recorded arguments are JSON values, whose repr tells any two apart (1, 1.0, True)
        key = (name, repr((call.shapes, call.dtypes, call.concrete))) if call is not None else None
        numbers = known.get(key)
        if numbers is None:
            cost = _cost(tree.names[name], call)
            first = next((d for d in call.dtypes if type(d) is str and d in ELEMENT_BYTES), "") if call is not None else ""
            numbers = known[key] = (*(cost if cost is not None else (np.nan, np.nan)), first)
        found.append(numbers)
        if call is not None and call.message_bytes is not None:
            message[row] = call.message_bytes
    if found:
        columns = list(zip(*found))
        nbytes[ops], flops[ops], dtype[ops] = np.array(columns[0], float), np.array(columns[1], float), columns[2]
    _messages_from_ranges(tree, read_inputs, message)
    return nbytes, flops, dtype, message


def _messages_from_ranges(tree: EventTree, read_inputs, message: np.ndarray) -> None:
    """Older torch: a collective's message size from the one `MESSAGE_RANGES` range inside it."""
    kinds = [i for i, n in enumerate(tree.names) if n in MESSAGE_RANGES]
    ranges = np.flatnonzero(tree.survivor & tree.sync_host & np.isin(tree.name, kinds)) if kinds else ()
    if not len(ranges):
        return
    found: dict[int, float] = {}
    for parent, call in zip(tree.parent[ranges].tolist(), read_inputs(tree.order[ranges])):
        if parent < 0 or tree.names[tree.name[parent]] != COLLECTIVE or not np.isnan(message[parent]):
            continue
        tensors = [Tensor(tuple(s), d) for s, d in zip(call.shapes, call.dtypes) if d in ELEMENT_BYTES] if call else []
        found[parent] = tensors[0].nbytes if len(tensors) == 1 and parent not in found else np.nan
    for parent, size in found.items():
        message[parent] = size


def _cost(name: str, call: OpInputs | None) -> tuple[int, int] | None:
    """`op_traffic`, with recorded arguments it cannot read (another torch's layout) as unknown."""
    if call is None:
        return None
    try:
        return op_traffic(name, call)
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError):
        return None


def traffic_by_name(traffic: tuple[np.ndarray, ...], rows: np.ndarray,
                    name: np.ndarray, names: list[str]) -> tuple[tuple[str, float, float, str, float], ...]:  # fmt: skip
    """(op name, bytes, FLOPs, dtype, message bytes) summed over its calls among `rows`; NaN where
    one call is unknown (message bytes: NaN for an op that is not a collective); the dtype its
    calls share ("" when they differ)."""
    nbytes, flops, dtype, message = traffic[0][rows], traffic[1][rows], traffic[2][rows], traffic[3][rows]
    ids = name[rows]
    found = []
    for k in np.unique(ids).tolist():
        mine = ids == k
        kinds = set(dtype[mine].tolist())
        found.append((names[k], float(nbytes[mine].sum()), float(flops[mine].sum()), kinds.pop() if len(kinds) == 1 else "",
                      float(message[mine].sum())))  # fmt: skip
    return tuple(found)


@dataclass(frozen=True)
class TrafficCoverage:
    """How much of the device time the ops launched has bytes: each kernel counted once, on the
    innermost op that launched it (its self device time). `uncovered`: (op name, µs) of the calls
    without bytes, largest first."""

    covered_us: float
    total_us: float
    uncovered: tuple[tuple[str, float], ...]

    @property
    def percent(self) -> float:
        return 100.0 * self.covered_us / self.total_us if self.total_us > 0 else float("nan")


def traffic_coverage(traffic: tuple[np.ndarray, ...], self_device_us: np.ndarray, rows: np.ndarray,
                     name: np.ndarray, names: list[str]) -> TrafficCoverage:  # fmt: skip
    """`TrafficCoverage` of the op rows `rows` (`traffic`: `event_traffic`'s columns): a call is
    covered by its bytes or, a collective, by its message size."""
    time, known = self_device_us[rows], np.isfinite(traffic[0][rows]) | np.isfinite(traffic[3][rows])
    missing = ~known & (time > 0)
    ids, slot = np.unique(name[rows][missing], return_inverse=True)
    sums = np.bincount(slot, weights=time[missing], minlength=len(ids))
    uncovered = sorted(((names[k], float(v)) for k, v in zip(ids.tolist(), sums.tolist())), key=lambda p: (-p[1], p[0]))
    return TrafficCoverage(float(time[known].sum()), float(time.sum()), tuple(uncovered))
