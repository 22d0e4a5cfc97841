"""What a chrome trace's events must hold to be read, and the one-line error for the first that
does not (a ValueError naming `traceEvents[i]`). Pure.

A trace comes from anywhere (`mlflow-neuron ingest`): a time may be a string, NaN, negative or
past any clock, an id a float or a 400-digit integer, a name a list. Each is refused with the
event's index and what is wrong, never a traceback. The reader's loop checks only types inline
(it is most of a helper's cycle); ranges are checked on whole columns (`checked_numbers`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

# A time beyond 2**52 us (143 years) is not a time, and ts + dur would overflow int64 nanoseconds;
# epoch microseconds (HTA's CUDA traces: 1.7e15) stay well below it.
MAX_US = 2.0**52
_INT64 = 2**63


def checked_numbers(rows: list, events: list, offset: int) -> None:
    """The ValueError `checked` gives for the first row whose ts or dur is not finite, negative or
    beyond `MAX_US` (the row loop only checked their types). A row's ts is `row[1]`, its dur
    `row[2]`, its index in traceEvents `row[-1]`."""
    if not rows:
        return
    try:
        ts = np.fromiter((r[1] for r in rows), np.float64, len(rows))
        dur = np.fromiter((r[2] for r in rows), np.float64, len(rows))
    except OverflowError:  # an integer past float64's range
        bad = np.array([not (0 <= r[1] <= MAX_US and 0 <= r[2] <= MAX_US) for r in rows])
    else:
        bad = ~((ts >= 0) & (ts <= MAX_US) & (dur >= 0) & (dur <= MAX_US))  # NaN compares false
    if bad.any():
        index = rows[int(np.argmax(bad))][-1]
        checked(events[index - offset], index, "ts", "dur")


def checked(event: Mapping, index: int, *keys: str) -> tuple:
    """(ts, dur or None, name) of an event that has them, else a ValueError saying which is wrong."""
    name = event.get("name")
    if not isinstance(name, str):
        raise ValueError(f"traceEvents[{index}] ({event.get('cat')}) has no string 'name': {name!r}")
    values = []
    for key in keys:
        value = event.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"traceEvents[{index}] ({event.get('cat')} {name!r}) has no numeric {key!r}: {_short(value)}")
        if not 0 <= value <= MAX_US:
            what = "a negative" if value < 0 else "an impossibly large (over 2**52 us)"
            raise ValueError(f"traceEvents[{index}] ({event.get('cat')} {name!r}) has {what} {key!r}: {_short(value)}")
        values.append(float(value))
    return values[0], values[1] if len(values) > 1 else None, name


def int_arg(args: Any, key: str, index: int) -> int:
    """`args[key]` as an id (0 when absent or null); a ValueError for anything but a 64-bit integer."""
    value = args.get(key, 0) if isinstance(args, Mapping) else 0
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"traceEvents[{index}] args[{key!r}] is not an integer: {_short(value)}")
    if not -_INT64 <= value < _INT64:
        raise ValueError(f"traceEvents[{index}] args[{key!r}] does not fit 64 bits: {_short(value)}")
    return value


def wrong_field(events: list, offset: int) -> str:
    """Where the first event is whose category, name, pid or tid cannot be a key (a list, an
    object), or whose ids do not fit 64 bits: "traceEvents[i]"."""
    for index, event in enumerate(events, offset):
        if not isinstance(event, Mapping):
            continue
        try:
            hash(tuple(event.get(key) for key in ("ph", "cat", "name", "pid", "tid")))
        except TypeError:
            return f"traceEvents[{index}]"
        args = event.get("args")
        if isinstance(args, Mapping):
            for key in ("External id", "correlation"):
                try:
                    int_arg(args, key, index)
                except ValueError:
                    return f"traceEvents[{index}]"
    return "an event of traceEvents"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
