"""A cycle's rank summary: what every rank of a job sends, by default, about each profiled step.

One small JSON document per rank per cycle (`_trace.collectives`' format: each step's time, its
time in collectives, exposed communication, idle time, copies, and each collective's start and
end), made off the training thread from the trace the training thread saved (in the same read as
the cycle's numbers where the rank logs them: `one_pass`). The callback's drain hands it to its
node's file (`Delivery.rank_part`; `_delivery.node_parts`, `node_file`: every local rank's summary
of a cycle in one file), as `ingest`'s node files do (`_capture.ingest_nodes`). The trace of a rank that logs no
metrics of its own serves this summary only and is not uploaded. Reading the summaries back across
ranks (waits, the straggler) is the read side's (`_readback.ranks`, `_analysis.ranks`).
"""

from __future__ import annotations

from pathlib import Path

from .._trace.json_text import dumps
from .job import CycleJob
from .model import RANK_SUMMARY, RANK_SUMMARY_FILE


def rank_trace(job: CycleJob, raw_trace: Path | None) -> Path | None:
    """The trace the job's rank summary is read from (a Neuron session's, else `raw_trace`), or None
    where the job asks for none or has no trace."""
    spec = job.rank_summary
    trace = (spec.get("trace") or raw_trace) if spec else None
    return Path(trace) if trace is not None else None


def rank_keywords(spec: dict) -> dict:
    """`collectives`' keywords for a rank summary (rank, host, world_size) from a job's
    `rank_summary` request; a host left empty is the trace's own `host_name`."""
    return {"rank": spec["rank"], "host": spec.get("host") or None, "world_size": spec["world_size"]}


def one_pass(job: CycleJob, raw_trace: Path | None) -> dict | None:
    """`ChromeTraceFile.summarize`'s `rank` keywords where the job's source reads the very file its
    rank summary comes from (then both come from one read of it); None where they differ."""
    trace, source = rank_trace(job, raw_trace), job.source
    if trace is None or not hasattr(source, "readable") or source.readable() != trace:
        return None
    return {**rank_keywords(job.rank_summary), "cycle_step": job.step}


def write_rank_summary(job: CycleJob, raw_trace: Path | None, made=None) -> tuple[tuple[str, str], ...]:
    """Writes the job's rank summary into its staged folder; returns the `Delivery.placed` entry
    that sends it at its own path (which `Preparer(node_parts=True)` turns into the delivery's
    `rank_part`), or () where the job asks for none or has no trace. `made`: the summary made in
    the cycle's own read (`one_pass`), or the error that read gave it; None: read its trace now. A
    trace that cannot be summarized is one of the job's problems, reported when it is sent; the
    rest of the cycle goes as it is."""
    spec, trace = job.rank_summary, rank_trace(job, raw_trace)
    if trace is None:
        return ()
    try:
        if isinstance(made, Exception):
            raise made
        summary = made
        if summary is None:
            from .._trace.collectives import rank_summary_from_chrome  # the parse lives with the analysis

            summary = rank_summary_from_chrome(str(trace), **rank_keywords(spec), cycle_step=job.step)
    except Exception as error:  # noqa: BLE001 - a trace it cannot read costs this file only
        job.problems.append(("rank_summary", f"profiler step {job.step} has no rank summary: "
                             f"{type(error).__name__}: {error}"))  # fmt: skip
        return ()
    (job.staged_dir / RANK_SUMMARY_FILE).write_bytes(dumps(summary))
    return ((RANK_SUMMARY_FILE, RANK_SUMMARY.format(rank=spec["rank"], step=job.step)),)
