"""JSON, fast, in the helper's loop: each cycle's trace is parsed (`parse`) and its timeline and
MLflow trace are written (`compact`), 2,000 spans each, where Python's `json` was a fifth of the
time. Pure.

orjson (a dependency) writes it; Python's `json` keeps a broken install working and takes what
orjson refuses (integers past 64 bits, keys that are not strings). Either way a NaN or an
infinity is refused: the text must be JSON that any reader takes.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

PARSER = "orjson" if orjson is not None else "json"


def parse(data: bytes) -> Any:
    """orjson, about three times as fast as `json`; Python's `json` takes what orjson refuses but
    Python writes, such as NaN. ValueError for what is not JSON, or is nested too deep to read."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(data)
    except RecursionError:  # arrays or objects nested past Python's recursion limit (orjson stops at 1024)
        raise ValueError("JSON nested too deep to read") from None


def compact(value: Any) -> str:
    """`value` as JSON without spaces; ValueError for a NaN or an infinity anywhere in it."""
    if orjson is not None:
        try:
            text = orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError is one
            pass
        else:
            if b"null" not in text or not _has_non_finite(value):  # orjson writes NaN as null
                return text.decode()
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> bytes:
    """`json.dumps(value)` as UTF-8, by orjson where it says the same (a NaN stays `NaN`, an int
    key becomes a string): a job's, a record's and a run's state files in the outbox, each cycle."""
    if orjson is not None:
        try:
            text = orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError is one: a key that is not a str, an int past 64 bits
            pass
        else:
            if b"null" not in text or not _has_non_finite(value):  # orjson writes NaN as null
                return text
    return json.dumps(value).encode()  # ASCII: a lone surrogate (which orjson refuses) is escaped


def _has_non_finite(value: Any) -> bool:
    kind = type(value)
    if kind is float:
        return not math.isfinite(value)
    if kind is dict:
        value = value.values()
    elif kind is not list and kind is not tuple:
        return False
    for item in value:  # a call only for what may hold a float: a rank summary's lists are thousands of ints
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return True
        elif (kind is dict or kind is list or kind is tuple) and _has_non_finite(item):
            return True
    return False


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Parsed trace events, or a run's state of thousands of steps, are many thousands of acyclic
    objects: Python's cycle collector would scan them again and again as they are made (about half
    of reading them), while reference counting frees them anyway."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
