"""An ingested job's rank summaries as node files (`_record.node_file`), made in a pool of processes.

    with RankBlocks(others, world_size, tmp) as blocks:     # the pool starts on `others` at once
        ...                                                 # meanwhile: the lowest rank's cycles, in full
        for block in blocks.results(lowest):                # `lowest`: their summaries (JSON bytes)
            block.files                                     # (local file, artifact path, cycle, ranks) to send
            block.lines                                     # (trace, rank, cycle, why it has no summary)

`ingest` logs the lowest rank's cycles in full and takes every other rank's trace for its rank
summary only. A summary is small; its trace is not, and reading it is the cost (a 6-step trace of
a 3D job: 450 KB, 15-20 ms). So the traces are read in blocks of consecutive ranks, a block a task
in a pool of processes, and each block's summaries written where they were made: one Parquet file
per host and cycle, as a node's callback sends them (docs/ranks.md). The lowest rank's own
summaries, made in the full read of its cycles, join the first block, which is read last for
that. A task holds one block's summaries; whatever the job's size, memory is the workers times a
block. A trace that cannot be read costs its own summary: its task says why, the rest is written.

This module imports no MLflow and no pandas: a worker starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from .._neuron.manifest import manifest
from .._record import node_file
from .._record.model import neuron_dir, node_file as node_file_path
from .._trace.collectives import rank_summary_from_chrome
from .._trace.json_text import dumps, parse

POOL_FROM = 32  # traces; fewer are read in this process (starting a pool costs more than it saves)
MAX_WORKERS = 8
BLOCK_RANKS = (8, 64)  # ranks a block, at least and at most: about 4 blocks a worker in between
NODE_FILE_NAME = "node.parquet"  # each in a folder of its own (one delivery's files_dir)


@dataclass(frozen=True)
class Block:
    """What one block gave: its node files, and a line per trace."""

    files: tuple[tuple[str, str, int, int], ...]  # (local file, artifact path, cycle, ranks in it)
    lines: tuple[tuple[str, int, int | None, str | None], ...]  # (trace, rank, cycle or None, problem or None)


def read_block(traces: list[tuple[str, int]], world_size: int, out: str, lowest: list[bytes] = ()) -> Block:
    """The block's rank summaries (each trace's, and `lowest`, summaries already made) written as
    one node file per host and cycle in folders under `out`. Runs in a worker."""
    parts: dict[tuple[str | None, int], list[dict]] = {}
    lines = []
    for text in lowest:  # the lowest rank's: its manifest went with its cycle
        summary = parse(text)
        parts.setdefault((summary.get("host"), summary["cycle_step"]), []).append({"summary": summary, "manifest": None})
    for trace, rank in traces:
        try:
            summary = rank_summary_from_chrome(trace, rank=rank, world_size=world_size)
        except Exception as error:  # noqa: BLE001 - a trace it cannot read costs its own summary only
            lines.append((trace, rank, None, f"{type(error).__name__}: {error}"))
            continue
        summary["cycle_step"] = cycle = cycle_of(summary)
        record = manifest([], neuron_dir=neuron_dir(cycle), output_dir="", trace_source=trace, max_file_bytes=None,
                          rank=rank)  # fmt: skip
        parts.setdefault((summary["host"], cycle), []).append({"summary": summary, "manifest": record})
        lines.append((trace, rank, cycle, None))
    files = []
    for (host, cycle), group in sorted(parts.items(), key=lambda item: (item[0][1], str(item[0][0]))):
        group.sort(key=lambda part: part["summary"]["rank"])
        first = group[0]["summary"]["rank"]
        folder = Path(out, f"cycle_{cycle}_rank_{first}_{len(files)}")
        folder.mkdir(parents=True)
        node_file.write(group, folder / NODE_FILE_NAME, host=host, cycle_step=cycle)
        files.append((str(folder / NODE_FILE_NAME), node_file_path(host, cycle, first), cycle, len(group)))
    return Block(tuple(files), tuple(lines))


def cycle_of(summary: dict) -> int:
    """The step the callback would have logged the trace's cycle at: its last ProfilerStep + 1 (1
    for a trace without step markers)."""
    steps = [s["step"] for s in summary["steps"] if isinstance(s.get("step"), int)]
    return max(steps) + 1 if steps else 1


def blocks_of(ranks: list[int], workers: int) -> list[list[int]]:
    """Indices into `ranks`, grouped by blocks of consecutive ranks (a power of two from 8 to 64
    of them, so that a block holds whole hosts of 8, 16, 32 or 64 ranks), in rank order."""
    size, lo_hi = BLOCK_RANKS[0], BLOCK_RANKS[1]
    distinct = len(set(ranks))
    while size < lo_hi and distinct / size > 4 * workers:
        size *= 2
    grouped: dict[int, list[int]] = {}
    for index, rank in enumerate(ranks):
        grouped.setdefault(rank // size, []).append(index)
    return [grouped[key] for key in sorted(grouped)]


def worker_env() -> dict[str, str]:
    """This environment, with the folder this `mlflow_neuron` was imported from on PYTHONPATH where
    it is a source checkout (a caller may have put it on `sys.path` itself), not where it is
    installed (site-packages ahead of the standard library could hide a module of it)."""
    import site

    home = Path(__file__).resolve().parents[2]
    installed = [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]
    if any(home == Path(p).resolve() for p in installed):
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(home), os.environ.get("PYTHONPATH")) if p)}


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


class RankBlocks:
    """The blocks of `others` ((trace, rank) of each trace read for its summary only; the `lowest`
    rank joins the first block), read from the moment this is made by `workers` processes of
    their own (`python -m` this module: nothing of the caller's program is run again in them), or
    in this process where the traces are few."""

    def __init__(self, others: list[tuple[Path, int]], world_size: int, out: Path, lowest: int,
                 workers: int | None = None):  # fmt: skip
        self.world_size, self.out = world_size, str(out)
        workers = workers or default_workers()
        ranks = [lowest, *(rank for _, rank in others)]  # the lowest rank's place: index 0
        traces = [None, *((str(trace), rank) for trace, rank in others)]
        self.blocks = [[traces[i] for i in block if i] for block in blocks_of(ranks, workers)]
        self.tasks: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self.workers: list[tuple[subprocess.Popen, threading.Thread]] = []
        if workers > 1 and len(others) >= POOL_FROM:
            for block in self.blocks[1:]:
                self.tasks.put({"traces": block, "world_size": world_size, "out": self.out, "lowest": []})
            for _ in range(min(workers, math.ceil(len(others) / POOL_FROM))):
                self._start()

    def results(self, lowest: list[bytes]):
        """Each block's `Block` as it is done: the first (with `lowest`, the lowest rank's summaries)
        is read once the others are under way."""
        if not self.workers:
            for index, block in enumerate(self.blocks):
                yield read_block(block, self.world_size, self.out, lowest if index == 0 else [])
            return
        self.tasks.put({"traces": self.blocks[0], "world_size": self.world_size, "out": self.out,
                        "lowest": [text.decode() for text in lowest]})  # fmt: skip
        for _ in self.blocks:
            got = self.done.get()
            if isinstance(got, Exception):
                raise got
            yield got

    def _start(self) -> None:
        process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=worker_env())  # fmt: skip
        thread = threading.Thread(target=self._drive, args=(process,), name="mlflow-neuron-ingest", daemon=True)
        self.workers.append((process, thread))
        thread.start()

    def _drive(self, process: subprocess.Popen) -> None:
        """Hands the worker one task at a time, while there are any; its answers go to `done`."""
        while True:
            task = self.tasks.get()
            if task is None:
                return
            try:
                process.stdin.write(dumps(task) + b"\n")
                process.stdin.flush()
                answer = process.stdout.readline()
                if not answer:
                    raise RuntimeError(f"a process reading rank traces ended (exit code {process.wait()})")
                self.done.put(Block(*(tuple(map(tuple, part)) for part in parse(answer))))
            except Exception as error:  # noqa: BLE001 - whatever it is, the reader must hear of it, not wait
                self.done.put(RuntimeError(f"mlflow-neuron ingest: {error}"))
                return

    def __enter__(self) -> RankBlocks:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # the tasks not begun are dropped; those under way, killed
            with contextlib.suppress(queue.Empty):
                while True:
                    self.tasks.get_nowait()
            for process, _ in self.workers:
                process.kill()
        for _ in self.workers:
            self.tasks.put(None)
        for process, thread in self.workers:
            thread.join()
            with contextlib.suppress(OSError):
                process.stdin.close()
            process.wait()


def _serve() -> None:
    """A worker: one task a line on stdin (JSON), one `Block` a line on stdout."""
    for line in sys.stdin.buffer:
        task = parse(line)
        block = read_block(task["traces"], task["world_size"], task["out"], [t.encode() for t in task["lowest"]])
        sys.stdout.buffer.write(dumps([block.files, block.lines]) + b"\n")
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    _serve()
