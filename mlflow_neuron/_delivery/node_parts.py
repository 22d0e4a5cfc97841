"""One file per node per cycle for the rank summaries: every local rank's part of a cycle, gathered
in the outbox until its node's file can be made, then sent in one file.

The ranks of a node share an outbox and its one consumer (`drain`). Preparing a rank's cycle, the
drain moves the rank's summary out of the entry (`take`) into the outbox's parts area:

    <outbox>/.ranks-<run>/             a run's node state (<run>: the run's id, else its key)
        alive-<rank>                   a lock file each local rank's callback holds while it lives (`Presence`)
        seen.json                      {rank: the latest cycle it gave a part of}
        cycle_<step>/rank_<r>.json     a rank's summary of the cycle, its manifest where it uploads
                                       nothing else, its run and its entry's name: until the file is made

An entry that held nothing else is then settled without a request. A cycle's parts become the
node's Parquet file (`_record.node_file`) once every local rank, every rank whose callback took an
`alive-<rank>` lock here, is accounted for (`due`): inside the entry whose part completed them
where that entry is sent anyway (`ride_along`: rank 0's cycle), else as an entry of its own
(`make_entry`: a prepared record, sent, retried, kept, rejected and synced as any other):

  - its part of the cycle is in; or
  - it gave a part of a later cycle (its trace of this one could not be read); or
  - it is gone: its lock is free (its callback closed, or its process died: the kernel frees the
    lock of a process however it ends) and no entry of the outbox is still unprepared (a rank's
    cycles are queued before it lets go, so its last part is in once those are prepared); or
  - the cycle's first part is `NODE_WAIT_S` old (a rank that lives on and never sends it: hung).

A part that comes after its cycle's file was made goes into a file of its own for that cycle,
named by its lowest rank, so it never overwrites the first. The node entry is named after the
cycle's earliest entry, so a run's end (`end.json`, which waits for the run's earlier entries)
waits for it. Everything here runs under the outbox's consumer lock (one drain at a time); a part
is written whole (renamed in) before the entry that gave it is recorded, so a drain that dies
between the two prepares the entry again and writes the same part. The parts a node file holds
are removed only once the record that sends it is written (a drain killed before that leaves them
for the next, which makes the file again; one killed right after, the same file at the same path).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

from . import entries
from . import outbox as _outbox
from .entries import FILES
from .._record.model import RANKS_FOLDER, Delivery, RunRef, node_file
from .._trace.json_text import parse

NODE_WAIT_S = 60.0  # a cycle's file waits at most this long for a rank that lives on
# At close, the first local rank (whose drain sends what every local rank queued) waits this long
# for the node files that other local ranks, still alive, have yet to complete; the last to leave sends the rest.
FIRST_WAIT_S = 5.0
NODE_FILE = "node.parquet"  # in a node entry's files/
# What making a node's file may raise: the disk's refusals, pyarrow's (a number past 64 bits), a part
# not as written. Its parts stay, and the drain says so (`drain`), never raises it.
UNWRITABLE = (OSError, ValueError, TypeError, KeyError, ArithmeticError)
_PREFIX, _ALIVE, _SEEN, _CYCLE = ".ranks-", "alive-", "seen.json", "cycle_"


def area_name(run: RunRef) -> str:
    """The name of a run's parts area, taken once by each rank's callback when it starts (and
    written into each of its jobs): the run's id where the rank knows it then (rank 0 created the
    run and sent it to every rank), else its key (the server did not answer: every rank has the
    key only). So every rank of a job names the same area, even once some learn the run's id."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(run.run_id or run.run_key or "none"))


def run_folder(outbox: Path, name: str) -> Path:
    """The parts area named `name` (`area_name`) in `outbox`."""
    return Path(outbox) / f"{_PREFIX}{name}"


# -- the local ranks --------------------------------------------------------------------------------


class Presence:
    """This rank's `alive-<rank>` lock in its run's parts area, held from the callback's start to
    its close (or its process's end). Callbacks of one rank and run in one process share it."""

    _held: dict[Path, list] = {}  # lock file -> [Held, callbacks holding it]
    _lock = threading.Lock()

    def __init__(self, outbox: Path, name: str, rank: int) -> None:
        self.path = run_folder(outbox, name) / f"{_ALIVE}{rank}"
        self.joined = False
        with contextlib.suppress(OSError), self._lock:
            held = self._held.get(self.path)
            if held is None:
                _outbox.private_folder(self.path.parent)
                lock = entries.lock_file(self.path, blocking=False)
                if lock is None:  # another process of this rank and run (its earlier callback's): it counts
                    return
                held = self._held[self.path] = [lock, 0]
            held[1] += 1
            self.joined = True

    def leave(self) -> None:
        """This rank sends no more cycles: its node's files stop waiting for it."""
        with self._lock:
            held = self._held.get(self.path) if self.joined else None
            self.joined = False
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    held[0].release()
                    del self._held[self.path]


def _present(folder: Path) -> tuple[set[int], set[int]]:
    """(every rank that took a lock in `folder`, those whose lock is still held)."""
    known, alive = set(), set()
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith(_ALIVE) and name[len(_ALIVE):].isdigit():
                rank = int(name[len(_ALIVE):])
                known.add(rank)
                lock = entries.lock_file(folder / name, blocking=False)
                if lock is None:
                    alive.add(rank)
                else:
                    lock.release()
    return known, alive


def alone(outbox: Path, name: str) -> bool:
    """Whether no local rank of the run is present any more (this one has left)."""
    return not _present(run_folder(outbox, name))[1]


def left_at_close(outbox: Path, name: str, first: bool, since: float) -> list[int]:
    """The cycles whose node files a rank that began to close at `since` (monotonic) waits for,
    within its budget: all those of the run, as the last local rank to leave; as its node's first
    rank, those for `FIRST_WAIT_S` while other local ranks live; else none (they send them)."""
    if not alone(outbox, name) and not (first and time.monotonic() - since < FIRST_WAIT_S):
        return []
    return pending(outbox, name)


def waited_at_close(outbox: Path, name: str, unsettled: list, first: bool, since: float) -> list:
    """What a rank that began to close at `since` waits for and names, of (entry, step; None: the
    run's end): its own entries still in the queue (`unsettled`); as the last local rank to leave,
    also the run's end another rank queued (`run_ends`); but not its own run's end while the run's
    node files wait, past `left_at_close`, for a local rank that lives on (whose close ends it)."""
    if alone(outbox, name):
        return unsettled + [(end, None) for end in run_ends(outbox, name) if end not in {e for e, _ in unsettled}]
    if not left_at_close(outbox, name, first, since) and pending(outbox, name):
        return [(entry, step) for entry, step in unsettled if step is not None]
    return unsettled


# -- parts ----------------------------------------------------------------------------------------


def take(entry: Path, delivery: Delivery, run: RunRef, folder: Path) -> Delivery:
    """Moves the rank's part of the cycle (`Delivery.rank_part`) from the entry's files into the
    parts area `folder` (`run_folder`); returns the delivery without it."""
    if delivery.rank_part is None or not delivery.files_dir:
        return delivery
    summary_name, manifest_name = delivery.rank_part
    files = Path(delivery.files_dir)
    summary = parse((files / summary_name).read_bytes())
    manifest = parse((files / manifest_name).read_bytes()) if manifest_name else None
    rank, cycle = summary.get("rank"), delivery.step
    _outbox.private_folder(folder / f"{_CYCLE}{cycle}")
    plain = _outbox.plain_run(run)
    entries.write_json(folder / f"{_CYCLE}{cycle}" / f"rank_{rank}.json",
                       {"run": plain, "entry": entry.name, "summary": summary, "manifest": manifest})  # fmt: skip
    seen = _seen(folder)
    if isinstance(rank, int) and seen.get(str(rank), -1) < cycle:
        entries.write_json(folder / _SEEN, {**seen, str(rank): cycle})
    for name in (summary_name, manifest_name):
        if name:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(files / name)
    return replace(delivery, rank_part=None)


def _seen(folder: Path) -> dict[str, int]:
    try:
        seen = entries.read_json(folder / _SEEN)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in seen.items() if isinstance(v, int)}


def _cycles(folder: Path) -> dict[int, list[Path]]:
    """{cycle: its part files} of one run."""
    found = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith(_CYCLE) and name[len(_CYCLE):].isdigit():
                parts = sorted((folder / name).glob("rank_*.json"))
                if parts:
                    found[int(name[len(_CYCLE):])] = parts
    return found


def _rank_of(part: Path) -> int | None:
    number = part.stem.removeprefix("rank_")
    return int(number) if number.isdigit() else None


def due(outbox: Path, only: Path | None = None, cycle: int | None = None) -> tuple[list[tuple[Path, int]], int]:
    """(the cycles whose node files can be made now, as (run folder, cycle); how many wait for a
    local rank). `only`, `cycle`: look at that run's folder, that cycle, only."""
    ready, waiting, unprepared = [], 0, None
    folders = [only] if only is not None else _folders(outbox)
    for folder in folders:
        cycles = _cycles(folder)
        if cycle is not None:
            cycles = {cycle: cycles[cycle]} if cycle in cycles else {}
        if not cycles:
            continue
        known, alive = _present(folder)
        seen = _seen(folder)
        for step, parts in sorted(cycles.items()):
            missing = known - {_rank_of(p) for p in parts} - {int(r) for r, last in seen.items() if last > step}
            gone = bool(missing) and not missing & alive
            if gone and unprepared is None:  # a gone rank's last cycles may still wait to be prepared
                unprepared = _unprepared(outbox)
            if not missing or (gone and not unprepared) or _oldest_s(parts) >= NODE_WAIT_S:
                ready.append((folder, step))
            else:
                waiting += 1
    return ready, waiting


def _oldest_s(parts: list[Path]) -> float:
    ages = []
    for part in parts:
        with contextlib.suppress(OSError):
            ages.append(time.time() - part.stat().st_mtime)
    return max(ages, default=0.0)


def _folders(outbox: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return sorted(Path(outbox) / n for n in os.listdir(outbox) if n.startswith(_PREFIX))
    return []


def _unprepared(outbox: Path) -> bool:
    """Whether some entry of the outbox is still being written or waits to be prepared."""
    return any(entries.state(e) in (entries.QUEUED, entries.WRITING) for e in entries.listed(outbox))


def make_entry(outbox: Path, folder: Path, cycle: int, copy_max_bytes: int) -> Path | None:
    """The node entry of a cycle's parts: its Parquet file, recorded to be sent into the run (the
    parts then go). None where no part could be read (the unreadable ones are removed)."""
    parts, read = _parts_of(folder, cycle)
    if not parts:
        _remove(read)
        return None
    run = next((r for _, r in parts if r.run_key), parts[0][1])  # rank 0's names the run's key: its end waits
    held = entries.create(outbox, after=min(data.get("entry") or "" for data, _ in parts) or None)
    try:
        placed = _write(parts, held.path / FILES / NODE_FILE, cycle)
        delivery = Delivery(step=cycle, timestamp_ms=int(time.time() * 1000), artifact_dir=RANKS_FOLDER,
                            files_dir=str(held.path / FILES), placed=(placed,))  # fmt: skip
        _outbox.write_record(held.path, delivery, run, copy_max_bytes=copy_max_bytes, files_dir=FILES)
    except BaseException:
        entries.remove(held.path)
        raise
    finally:
        held.release()
    _remove(read)
    return held.path


def ride_along(delivery: Delivery, folder: Path) -> tuple[Delivery, list[Path]]:
    """`delivery` (a rank's cycle that is sent anyway, not yet recorded) with its cycle's node file
    among its files, where the cycle's parts are all in now (`due`): one entry instead of two; and
    the parts it holds, to be removed (`carried`) once the record that sends it is written."""
    if not due(folder.parent, folder, delivery.step)[0]:
        return delivery, []
    parts, read = _parts_of(folder, delivery.step)
    if not parts or not delivery.files_dir:
        return delivery, []
    try:
        placed = _write(parts, Path(delivery.files_dir, NODE_FILE), delivery.step)
    except UNWRITABLE:  # the parts stay: an entry of their own tries again, and says why it cannot
        unrecorded(Path(delivery.files_dir))
        return delivery, []
    return replace(delivery, placed=(*delivery.placed, placed)), read


def carried(parts: list[Path]) -> None:
    """The parts a node file holds, removed once the record that sends it is written: a drain
    killed before that leaves them, and the entry, for the next (which writes the file again)."""
    _remove(parts)


def unrecorded(files: Path) -> None:
    """Removes a node file from an entry whose record is not written yet (a drain killed while
    preparing it): its parts are still in their area, and the entry is prepared again."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(files / NODE_FILE)


def _parts_of(folder: Path, cycle: int) -> tuple[list[tuple[dict, RunRef]], list[Path]]:
    """(each readable part of the cycle with its run, in rank order; every part file found)."""
    parts, read = [], sorted(folder.glob(f"{_CYCLE}{cycle}/rank_*.json"), key=lambda p: _rank_of(p) or 0)
    for path in read:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = entries.read_json(path)
            parts.append((data, RunRef(**data["run"])))
    return parts, read


def _write(parts: list[tuple[dict, RunRef]], path: Path, cycle: int) -> tuple[str, str]:
    """Writes the node file of the parts at `path`; its `Delivery.placed` entry."""
    from .._record import node_file as node_format

    host, first = parts[0][0]["summary"].get("host"), _rank_of_part(parts[0][0])
    node_format.write([data for data, _ in parts], path, host=host, cycle_step=cycle)
    return path.name, node_file(host, cycle, first)


def _remove(parts: list[Path]) -> None:
    """The parts a node entry was made of (a part written meanwhile stays, for a file of its own)."""
    for part in parts:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
    with contextlib.suppress(OSError):
        if parts:
            os.rmdir(parts[0].parent)  # once empty


def _rank_of_part(data: dict) -> int:
    rank = data["summary"].get("rank")
    return rank if isinstance(rank, int) else 0


def is_node_entry(entry: Path) -> bool:
    """Whether an entry holds a node's file (named after the entry of its cycle it follows)."""
    return entry.name.count(".") == 1 and not entry.name.startswith(".")


def pending(outbox: Path, name: str) -> list[int]:
    """The cycles of the run whose parts area is `name` whose node files are not sent yet: parts
    waiting, or node entries in the queue."""
    steps = list(_cycles(run_folder(outbox, name)))
    for entry in entries.listed(outbox):
        if is_node_entry(entry):
            with contextlib.suppress(OSError, ValueError, KeyError, AttributeError):
                data = entries.read_json(entry / _outbox.RECORD)
                if name in (data["run"].get("run_id"), data["run"].get("run_key")):
                    steps.append(data["step"])
    return sorted(steps)


def run_ends(outbox: Path, name: str) -> list[Path]:
    """The run's ends in the queue (`run_end`) whose run's parts area is `name`: the last local rank
    to leave waits for them too, whichever rank queued them."""
    found = []
    for entry in entries.listed(outbox):
        if entries.state(entry) == entries.ENDING:
            with contextlib.suppress(OSError, ValueError):
                if entries.read_json(entry / entries.END).get("parts") == name:
                    found.append(entry)
    return found


def tidy(outbox: Path, name: str) -> None:
    """Removes a run's parts area once it holds no part and no local rank is present."""
    folder = run_folder(outbox, name)
    if folder.is_dir() and not _cycles(folder) and not _present(folder)[1]:
        shutil.rmtree(folder, ignore_errors=True)
