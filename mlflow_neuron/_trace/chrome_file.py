"""A chrome trace file read in pieces, so that reading a cycle holds a few MiB of parsed events at
a time instead of all of them. Pure: no torch, no MLflow.

Parsed whole, a 100,000-op cycle's trace becomes about 180 MiB of Python objects (1.5 KiB an
event) for a 29 MB file; the reader keeps numpy columns of it, about 100 bytes an event. Here the
file is read 1 MiB at a time and cut between two events of the `traceEvents` array, and each
piece is parsed on its own (orjson). A cut can only be made between a `}` and a `{` separated by
a comma; a cut inside a string would leave a piece that is not JSON, so any surprise in the file's
shape falls back to parsing it whole, which then also gives the precise error for a file that is
not a trace.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .json_text import parse

PIECE_BYTES = 1024**2
_KEY = b'"traceEvents"'
_OPEN = re.compile(rb"\s*:\s*\[")
_ARRAY_END = re.compile(rb"\}\s*\]")
_SPACE = b" \t\r\n"


@dataclass(frozen=True, eq=False)
class ReadPiece:
    """One list of events as `chrome.ChromeReader` read it, for a reader fed in the same pass
    (`read_chrome_file(also=)`, `rank_columns`)."""

    events: list  # the list, as parsed
    offset: int  # the index in traceEvents of events[0]
    columns: dict | None  # its rows (`chrome._COLUMNS`; `source`: an index in traceEvents); None: no rows
    aside: list[int]  # indices in traceEvents of the events that made no row but may matter elsewhere
    names: dict[str, int]  # every name read so far -> its id (the `name` column)
    categories: tuple[str, ...]  # the category of each `kind`


def read_pieces(path: str | Path, feed: Callable[[list], None], restart: Callable[[], None]) -> dict:
    """Hands `feed` the trace's events, in order, a list at a time; returns the trace without its
    events (`traceEvents: []`). Where the file's shape surprises the cutter, `restart()` says to
    forget what was fed, and the whole file comes in one list. Raises ValueError, saying why, for a
    file that is not a trace."""
    path = Path(path)
    try:
        with _open(path) as stream:
            try:
                return _stream(stream, feed)  # the events' own errors (a bad ts, ...) go up as they are
            except _Unexpected:
                restart()
        data = _read_all(path)
    except (OSError, EOFError, zlib.error) as error:  # zlib.error: a corrupt .gz
        raise ValueError(f"{path}: not a readable chrome trace ({type(error).__name__}: {error})") from error
    try:
        trace = parse(data)  # the whole file at once
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: not a readable chrome trace ({type(error).__name__}: {error})") from error
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a chrome trace (no traceEvents list)")
    feed(trace["traceEvents"])
    return {**trace, "traceEvents": []}


class _Unexpected(Exception):
    """The file is not laid out as the cutter expects (or is not JSON at all)."""


def _stream(stream, feed: Callable[[list], None]) -> dict:
    """The events fed in pieces and the header returned; `_Unexpected` when the file is not
    laid out as expected."""
    buffer, prefix = b"", None
    while prefix is None:  # up to the array's `[`
        data = stream.read(PIECE_BYTES)
        buffer += data
        at = buffer.find(_KEY)
        opened = _OPEN.match(buffer, at + len(_KEY)) if at >= 0 else None
        if opened is not None:
            prefix, buffer = buffer[:at], buffer[opened.end():]
        elif not data or len(buffer) > 4 * PIECE_BYTES:
            raise _Unexpected("no traceEvents array near the start")
    for events, rest in _pieces(stream, buffer):
        if events is None:  # the end of the array: `rest` follows its `]`
            header = _parse(prefix + b'"traceEvents":[]' + rest)
            if not isinstance(header, dict):
                raise _Unexpected("the trace is not an object")
            return header
        if events:
            feed(events)
    raise _Unexpected("the array has no end")


def _pieces(stream, buffer: bytes) -> Iterator[tuple[list | None, bytes]]:
    """(events, b"") for each piece, then (None, what follows the array)."""
    while True:
        data = stream.read(PIECE_BYTES)
        if not data:
            break
        buffer += data
        cut = _last_cut(buffer)
        if cut < 0:
            continue
        yield _parse(b"[" + buffer[:cut] + b"]"), b""
        buffer = buffer[buffer.index(b"{", cut):]
    stripped = buffer.lstrip(_SPACE)
    if stripped.startswith(b"]"):  # an empty array
        yield None, stripped[1:]
        return
    for end in _ARRAY_END.finditer(buffer):
        try:
            events = _parse(b"[" + buffer[: end.start() + 1] + b"]")
        except _Unexpected:
            continue  # a `}]` inside the last event (nested arrays, strings): try the next one
        yield events, b""
        yield None, buffer[end.end():]
        return
    raise _Unexpected("the traceEvents array does not end: a truncated file")


def _last_cut(buffer: bytes) -> int:
    """The index just after the `}` of the last event followed by `,` and `{` in `buffer`; -1."""
    brace = buffer.rfind(b"{")
    while brace > 0:
        k = brace - 1
        while k >= 0 and buffer[k] in _SPACE:
            k -= 1
        if k >= 0 and buffer[k] == ord(","):
            k -= 1
            while k >= 0 and buffer[k] in _SPACE:
                k -= 1
            if k >= 0 and buffer[k] == ord("}"):
                return k + 1
        brace = buffer.rfind(b"{", 0, brace)
    return -1


def _parse(data: bytes) -> Any:
    """A piece (or the header) parsed; `_Unexpected` if it is not JSON, or holds a non-object event
    (the whole-file read then reports it as the reader always has)."""
    try:
        value = parse(data)
    except ValueError as error:
        raise _Unexpected(str(error)) from error
    if isinstance(value, list) and not all(type(e) is dict for e in value):
        raise _Unexpected("an event of the trace is not an object")
    return value


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def _read_all(path: Path) -> bytes:
    with _open(path) as stream:
        return stream.read()
