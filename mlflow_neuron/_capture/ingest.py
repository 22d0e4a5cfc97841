"""Ingesting profiles produced elsewhere: a Neuron profile output folder, a
`tensorboard_trace_handler` folder, a folder of one chrome trace per rank, or one chrome-trace file.

Every cycle also gets its rank summary, in a node file (`profiler/ranks/node_<host>/cycle_<step>_rank_<first>.parquet`)
as the callbacks of a node send them. Where the traces come from several ranks (`ranks`), the lowest
rank's cycles are logged as the callback's rank 0 logs them, and every other rank's trace gives its
rank summary only, read in a pool of processes meanwhile (`ingest_nodes`): one run for the job.

Each cycle goes through the callback's own pipeline (`_trace.summarize`, then `Preparer`), so
per-op numbers, keys and files come out as the callback's would for the same cycle, and an
ingested run compares with a live one. Device events are linked to ops from the trace itself
(`_trace.chrome_links`).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .._delivery.outbox import human_size, link_or_copy, sent_files
from .._record.job import CycleJob
from .._neuron.manifest import manifest
from .._delivery.mlflow_io import RunLogger
from .._record.model import SOURCE_TAG, Delivery, RunRef, cycle_dir
from .._record.rank_summary import rank_keywords
from .._record.prepare import Preparer
from .._delivery.report import Reporter
from ..exceptions import MLflowNeuronWarning
from .._neuron import layout
from .._neuron.output_files import TOO_LARGE, UPLOAD, FoundFile
from .._trace.chrome import read_chrome_file
from .._trace.chrome_links import Linking
from .._trace.json_text import cycle_collector_paused
from .._trace.summarize import CycleSettings, CycleSummary, RankPass, Summarized, summarize
from .._trace.timeline import DEFAULT_MAX_SPANS
from . import ingest_ranks as ranks
from .ingest_nodes import Block, RankBlocks

TENSORBOARD_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
CHROME_SUFFIXES = (".json", ".json.gz")
# Above this share of a cycle's device time left on no op, ingest warns: per-op numbers then miss
# more than rounding, and the reason is in the trace (launches outside ops, device events without
# a launch), not in the numbers.
WEAK_ATTRIBUTION_SHARE = 0.05


@dataclass(frozen=True)
class TraceCycle:
    """One cycle found under the ingested path: its framework trace and the files beside it."""

    trace: Path
    files: tuple[Path, ...] = ()  # Neuron session files, uploaded under neuron/<relative path>
    root: Path | None = None  # what `files` are relative to


def find_cycles(path: Path) -> list[TraceCycle]:
    """The cycles under `path`, oldest first. Raises ValueError when there is none."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if path.is_file():
        return [TraceCycle(path)]
    tensorboard = sorted(p for p in path.iterdir() if p.name.endswith(TENSORBOARD_SUFFIXES))
    if tensorboard:
        return [TraceCycle(p) for p in sorted(tensorboard, key=_tensorboard_time)]
    root = _neuron_root(path)
    traces = sorted(p for p in path.rglob("*") if p.is_file() and layout.is_framework_trace(p.name))
    # A session's files: those whose nearest folder with a framework trace is the trace's own. The
    # older NeuronProfiler puts pytorch_trace.json in the output folder and the runtime's session
    # folders below it, without a trace of their own.
    trace_dirs = {t.parent for t in traces}
    by_dir: dict[Path, list[Path]] = {}
    for file in (p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
        owner = next((d for d in file.parents if d in trace_dirs), None)
        if owner is not None:
            by_dir.setdefault(owner, []).append(file)
    cycles = [TraceCycle(trace, tuple(sorted(by_dir.get(trace.parent, []))), root) for trace in traces]
    if not cycles:  # one trace per rank, named as their writer liked (rank0.json.gz, sampled_rank-1.json)
        cycles = [TraceCycle(p) for p in sorted(path.iterdir()) if p.name.endswith(CHROME_SUFFIXES)
                  and ranks.trace_rank(p)[0] is not None]  # fmt: skip
    if not cycles:
        raise ValueError(
            f"{path}: no chrome trace found (expected a Neuron output folder with trace.json or "
            f"neuron_framework_trace_rank_<N>.json or pytorch_trace.json, *.pt.trace.json[.gz] files, or a trace file)"
        )
    return cycles


def read_cycle(trace_file: Path, index: int, *, log_timeline: bool = True, max_spans: int = DEFAULT_MAX_SPANS,
               rank: dict | None = None) -> tuple[int, CycleSummary, Linking]:  # fmt: skip
    """One trace file summarized: (the step it is logged at, its summary, how its device events
    were linked); with `rank` (rank, host, world_size), its rank summary from the same read.
    Raises ValueError for a file that is not a trace, or one without host ops."""
    with cycle_collector_paused():  # resumed once what the read made is freed (`ChromeTraceFile.summarize`)
        step, summary, linking = _read_cycle(trace_file, index, log_timeline, max_spans, rank)
    if not summary.profile.ops:
        raise ValueError(f"{trace_file}: the trace has no host op events (cpu_op / user_annotation), nothing to log")
    return step, summary, linking


def _read_cycle(trace_file: Path, index: int, log_timeline: bool, max_spans: int,
                rank: dict | None) -> tuple[int, CycleSummary, Linking]:  # fmt: skip
    ranks = RankPass() if rank is not None else None
    cycle = read_chrome_file(trace_file, also=ranks)  # shapes: the timeline's, and each op's bytes and FLOPs
    # The step the callback would have logged this cycle at: the last ProfilerStep + 1.
    step = cycle.last_step + 1 if cycle.last_step is not None else index
    settings = CycleSettings(cycle.device, cycle.device_profiled, default_step=max(step - 1, 0), max_spans=max_spans,
                             timeline_step=step if log_timeline else None, timeline_root=cycle_dir(step))  # fmt: skip
    summary = summarize(cycle.raw, settings, cycle.inputs)
    return step, (summary if ranks is None else ranks.into(summary, **rank, cycle_step=step)), cycle.linking


def weak_attribution(linking: Linking) -> str | None:
    """A sentence on device time that no op carries, when it is more than WEAK_ATTRIBUTION_SHARE."""
    if linking.unattributed_share <= WEAK_ATTRIBUTION_SHARE:
        return None
    if linking.unlinked and not (linking.by_external_id or linking.through_runtime):
        cause = "no device event could be linked to a launching op"
    else:
        cause = f"{linking.unlinked} of {linking.device_events} device events have no launch inside a host op"
    return (f"{linking.unattributed_device_time_us:,.0f} of {linking.device_time_us:,.0f} us of device time "
            f"({linking.unattributed_share:.1%}) is attributed to no op: {cause} (device events without a "
            f"correlation id or runtime launch, launches from threads or code outside torch ops, or a trace "
            f"cut mid-step); per-op device time covers the rest")  # fmt: skip


def ingest(path: Path, run: RunRef | Callable[[], RunRef], *, top_k: int = 50, max_file_bytes: int | None = None,
           out=None, log_timeline: bool = True, timeline_max_spans: int = DEFAULT_MAX_SPANS,
           workers: int | None = None) -> tuple[str, int]:  # fmt: skip
    """Logs every cycle under `path` into `run`; returns (run id, cycles logged). With
    `log_timeline`, each cycle is also a trace, as the callback logs it. The other ranks' traces
    are read in `workers` processes (default: one a CPU, at most 8).

    `run` may be a function that makes the run: it is called only once the first cycle has been
    read, so a path that holds no readable trace creates nothing."""
    out = out or sys.stdout
    reporter = Reporter()
    preparer = Preparer(reporter, top_k=top_k, node_parts=True)  # the rank summaries go in node files
    cycles, others, world_size, left_out = ranks.split_by_rank(find_cycles(path))
    for trace, why in left_out:  # among several ranks' traces: said, and the rest ingested
        print(f"[left out] {trace}: not a readable chrome trace ({why})", file=out, flush=True)
        reporter.problem("rank_summary", f"{trace}: not a readable chrome trace ({why}): left out")
    logger, lowest = None, []
    with tempfile.TemporaryDirectory(prefix="mlflow-neuron-ingest-") as tmp, \
            RankBlocks(others, world_size, Path(tmp), ranks.summary_spec(cycles[0].trace, world_size)["rank"],
                       workers) as blocks:  # fmt: skip
        for index, cycle in enumerate(cycles, 1):
            spec = ranks.summary_spec(cycle.trace, world_size)
            step, summary, linking = read_cycle(cycle.trace, index, log_timeline=log_timeline,
                                                max_spans=timeline_max_spans, rank=rank_keywords(spec))  # fmt: skip
            attribution = linking.as_dict()
            weak = weak_attribution(linking)
            if weak:
                attribution["warning"] = weak
                warnings.warn(f"mlflow-neuron: {cycle.trace}: {weak}", MLflowNeuronWarning, stacklevel=2)
            job = _job_for(cycle, summary, step, max_file_bytes, first=index == 1, attribution=attribution)
            job.rank_summary = spec
            if logger is None:
                logger = RunLogger(run() if callable(run) else run)
            delivery, files = _send(job, preparer, logger, reporter, cycle.trace, lowest)
            print(f"[{index}/{len(cycles)}] {cycle.trace} -> step {step}: {len(summary.profile.ops)} ops, "
                  f"{len(delivery.metrics)} metrics, {len(files)} file(s), {human_size(sum(files.values()))}",
                  file=out, flush=True)  # fmt: skip
        for block in blocks.results(lowest):
            _send_block(block, logger, reporter, out)
    return logger.run.run_id, len(cycles)


def _send(job: CycleJob, preparer: Preparer, logger: RunLogger, reporter: Reporter, trace: Path, lowest: list):
    """Prepares and delivers one job; (its delivery, {file: bytes} uploaded). Its rank summary is
    added to `lowest` (JSON bytes), for its node's file."""
    try:
        delivery = preparer.with_run_summary(preparer.prepare(job))
        if delivery.rank_part is not None:
            made = Path(delivery.files_dir, delivery.rank_part[0])
            lowest.append(made.read_bytes())
            made.unlink()
            delivery = replace(delivery, rank_part=None)
        _, vanished = logger.deliver(delivery)
        files = sent_files(delivery, vanished)  # what was uploaded: generated files and the profile's own
    finally:
        shutil.rmtree(job.staged_dir, ignore_errors=True)
    for kind, problem in job.problems:
        reporter.problem(kind, f"{trace}: {problem}")
    return delivery, files


def _send_block(block: Block, logger: RunLogger, reporter: Reporter, out) -> None:
    """A block's node files, sent in one artifact pass; a line for each, then a line per trace."""
    if block.files:
        logger.deliver_many([Delivery(step=cycle, timestamp_ms=int(time.time() * 1000), artifact_dir=cycle_dir(cycle),
                                      files_dir=str(Path(local).parent), placed=((Path(local).name, artifact),))
                             for local, artifact, cycle, _ in block.files])  # fmt: skip
    for local, artifact, _, count in block.files:
        size = Path(local).stat().st_size
        shutil.rmtree(Path(local).parent, ignore_errors=True)
        print(f"[node file] {artifact}: {count} rank summaries, 1 file(s), {human_size(size)}", file=out, flush=True)
    for trace, rank, cycle, problem in block.lines:
        if problem is None:
            print(f"[rank {rank}] {trace} -> its rank summary, step {cycle}", file=out, flush=True)
        else:
            print(f"[rank {rank}] {trace} -> no rank summary: {problem}", file=out, flush=True)
            reporter.problem("rank_summary", f"{trace}: no rank summary: {problem}")


def _job_for(cycle: TraceCycle, summary: CycleSummary, step: int, max_file_bytes: int | None, first: bool,
             attribution: dict) -> CycleJob:  # fmt: skip
    step_dir = cycle_dir(step)
    found = []
    for file in cycle.files:
        size = file.stat().st_size
        decision = TOO_LARGE if max_file_bytes is not None and size > max_file_bytes else UPLOAD
        found.append(FoundFile(file, file.relative_to(cycle.root).as_posix(), size, decision))
    job = CycleJob(
        step=step, timestamp_ms=int(time.time() * 1000), artifact_dir=step_dir,
        staged_dir=Path(tempfile.mkdtemp(prefix="mlflow-neuron-ingest-")), source=Summarized(summary),
        params={"profiler.ingested_from": str(cycle.root or cycle.trace.parent)} if first else {},
        uploads=tuple((str(f.path), f"{step_dir}/neuron/{f.relative_path}".rsplit("/", 1)[0])
                      for f in found if f.decision == UPLOAD),
        register_table=True, tags={SOURCE_TAG: "ingest"},
        table_note=f"reconstructed from {cycle.trace} (no torch events to build torch's own table)\n",
    )  # fmt: skip
    if cycle.files:  # the framework trace is one of the session's files
        trace_source = f"{step_dir}/neuron/{cycle.trace.relative_to(cycle.root).as_posix()}"
    else:
        job.raw_trace = job.staged_dir / ("raw_trace.json.gz" if cycle.trace.suffix == ".gz" else "raw_trace.json")
        link_or_copy(cycle.trace, job.raw_trace)
        trace_source = str(cycle.trace)
    job.manifest = manifest(found, neuron_dir=f"{step_dir}/neuron", output_dir=str(cycle.root or ""),
                            trace_source=trace_source, max_file_bytes=max_file_bytes, rank=0,
                            attribution=attribution)  # fmt: skip
    if cycle.files and layout.is_neuron_session([f.name for f in cycle.files]):
        job.summary_tool, job.summary_sessions = layout.neuron_summary_tool(), (str(cycle.trace.parent),)
    return job


def _neuron_root(path: Path) -> Path:
    """The profile output folder that Neuron's `<instance>_pid_<pid>/<timestamp>/` sits in."""
    if layout.process_of(path.name) is not None:
        return path.parent
    if path.parent != path and layout.process_of(path.parent.name) is not None:
        return path.parent.parent
    return path


def _tensorboard_time(path: Path) -> tuple[int, str]:
    # tensorboard_trace_handler names files <worker>.<time_ns>.pt.trace.json[.gz]
    stem = path.name.split(".pt.trace.json")[0]
    number = stem.rsplit(".", 1)[-1]
    return (int(number) if number.isdigit() else 0, path.name)

