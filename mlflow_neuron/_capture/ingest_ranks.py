"""Which rank an ingested trace is from, and what each rank's trace becomes in the job's one run.

A trace names its rank in Kineto's `distributedInfo` (`{"backend", "rank", "world_size", ...}`,
near the top of the file); a trace without it is placed by its file name (`rank0.json.gz`,
`sampled_rank-1.json`, `neuron_framework_trace_rank_3.json`). The lowest rank's cycles are logged
in full, as the callback's rank 0 logs them; every other rank's trace gives its rank summary only
(`ingest_nodes`).
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path


HEAD_BYTES = 1024**2  # Kineto writes distributedInfo before the events
FIRST_BYTES = 64 * 1024  # where it is, in every trace seen (the rest of HEAD_BYTES is read only if not)
_NAME_RANK = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)
_INFO = rb'"distributedInfo"\s*:\s*\{[^}]*?"%s"\s*:\s*(\d+)'
_INFO_RANK, _INFO_WORLD = re.compile(_INFO % b"rank"), re.compile(_INFO % b"world_size")


def trace_rank(path: Path) -> tuple[int | None, int | None]:
    """(rank, world size) of a trace file: its `distributedInfo`, else the rank in its name; None
    where neither says. A file that is not a chrome trace has no rank."""
    try:
        head = _read(path, FIRST_BYTES)
        rank, world = _INFO_RANK.search(head), _INFO_WORLD.search(head)
        if not (rank and world and max(rank.end(), world.end()) < len(head)) and len(head) == FIRST_BYTES:
            head = _read(path, HEAD_BYTES)  # not all there, or a number cut at the end
            rank, world = _INFO_RANK.search(head), _INFO_WORLD.search(head)
    except (OSError, EOFError, zlib.error):  # BadGzipFile is an OSError; a corrupt stream, zlib.error
        return None, None
    if b'"traceEvents"' not in head and b"distributedInfo" not in head:
        return None, None
    named = _NAME_RANK.search(Path(path).name)
    rank_value = int(rank.group(1)) if rank else int(named.group(1)) if named else None
    return rank_value, int(world.group(1)) if world else None


def split_by_rank(cycles: list) -> tuple[list, list[tuple[Path, int]], int, list[tuple[Path, str]]]:
    """(the cycles logged in full, the other ranks' traces with their ranks, the job's world size,
    the files left out with why). One rank (or none named): every cycle is logged in full. Among
    traces of several ranks, a file that is no chrome trace at all is left out (the caller says
    so); a chrome trace that names no rank cannot be placed: ValueError."""
    found = [(trace_rank(c.trace), c) for c in cycles]
    ranks = {rank for (rank, _), _ in found if rank is not None}
    worlds = [world for (_, world), _ in found if world]
    if len(ranks) <= 1:
        return cycles, [], max(worlds, default=1), []
    unread = [(c.trace, why) for (rank, _), c in found if rank is None for why in [_not_a_trace(c.trace)] if why]
    left = {path for path, _ in unread}
    unplaced = [str(c.trace) for (rank, _), c in found if rank is None and c.trace not in left]
    if unplaced:
        raise ValueError(f"traces of {len(ranks)} ranks ({min(ranks)}-{max(ranks)}) beside traces that name no rank "
                         f"(no distributedInfo, no rank in the file name): {', '.join(unplaced)}")  # fmt: skip
    lowest = min(ranks)
    return ([c for (rank, _), c in found if rank == lowest], [(c.trace, rank) for (rank, _), c in found
                                                             if rank is not None and rank != lowest],
            max(worlds, default=max(ranks) + 1), unread)  # fmt: skip


def _not_a_trace(path: Path) -> str | None:
    """Why a file is no chrome trace (unreadable, or no traceEvents in its first bytes), else None."""
    try:
        head = _read(path, HEAD_BYTES)
    except (OSError, EOFError, zlib.error) as error:
        return f"it cannot be read ({type(error).__name__}: {error})"
    return None if b'"traceEvents"' in head else "no traceEvents in its first bytes"


def summary_spec(trace: Path, world_size: int) -> dict:
    """What `CycleJob.rank_summary` asks for a trace: its rank (0 where it names none)."""
    rank, _ = trace_rank(trace)
    return {"rank": rank or 0, "world_size": world_size, "host": None, "trace": str(Path(trace).absolute())}


def _read(path: Path, size: int = -1) -> bytes:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read(size)
