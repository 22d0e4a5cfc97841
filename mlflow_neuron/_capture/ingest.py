"""Ingesting profiles produced elsewhere: a Neuron profile output folder, a
`tensorboard_trace_handler` folder, or one chrome-trace file.

Per-op numbers are computed from the trace itself (host op events, and the device events linked
to them by correlation id), with the same code and the same keys as the callback, and files are
uploaded in the same layout, so an ingested run compares with a live one.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._trace import chrome as _chrome
from .._neuron import devices as _devices
from .._neuron import output_files as _files
from .._delivery import record as _record
from .._trace.aggregate import aggregate
from .._trace.event_tree import EventTree, event_tree
from .._trace.function_events import CycleProfile
from .._delivery.keys import OpKeys
from .._delivery.mlflow_io import RunLogger, human_size, sent_files
from .._delivery.record import CycleRecord, RunRef
from .._delivery.report import MLflowNeuronWarning
from .._trace.timeline import DEFAULT_MAX_SPANS, Timeline, build_timeline
from .._trace.timeline_sources import timeline_inputs_from_chrome_trace

TENSORBOARD_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
# Above this share of a cycle's device time left on no op, ingest warns: per-op numbers then miss
# more than rounding, and the reason is in the trace (launches outside ops, device events without
# a launch), not in the numbers.
WEAK_ATTRIBUTION_SHARE = 0.05
_STEP_EVENT = re.compile(r"^ProfilerStep#(\d+)$")


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
    traces = sorted(p for p in path.rglob("*") if p.is_file() and _devices.is_framework_trace(p.name))
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
    if not cycles:
        raise ValueError(
            f"{path}: no chrome trace found (expected a Neuron output folder with trace.json or "
            f"neuron_framework_trace_rank_<N>.json or pytorch_trace.json, *.pt.trace.json[.gz] files, or a trace file)"
        )
    return cycles


def load_trace(path: Path) -> dict:
    """A chrome trace as JSON; a clear ValueError for truncated or non-JSON files."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            trace = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable chrome trace ({type(error).__name__}: {error})") from error
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a chrome trace (no traceEvents list)")
    return trace


def profile_of(trace: dict, source: Path, last_step: int = 0) -> CycleProfile:
    return linked_profile_of(trace, source, last_step)[0]


def linked_profile_of(trace: dict, source: Path, last_step: int = 0) -> tuple[CycleProfile, _chrome.Linking]:
    """The cycle's profile, and how its device events were linked to ops. `last_step` numbers
    the cycle's step when the trace has no ProfilerStep ranges."""
    return _read_cycle(trace, source, last_step)[:2]


def _read_cycle(trace: dict, source: Path, last_step: int) -> tuple[CycleProfile, _chrome.Linking, EventTree]:
    """The cycle's profile, its linking, and the event tree both the profile and the timeline use."""
    device, device_profiled = _devices.device_of_trace(trace)
    raw, linking = _chrome.read_chrome_trace(trace)
    tree = event_tree(raw)
    profile = aggregate(raw, device=device, device_profiled=device_profiled, default_step=last_step, tree=tree)
    if not profile.ops:
        raise ValueError(f"{source}: the trace has no host op events (cpu_op / user_annotation), nothing to log")
    return profile, linking, tree


def timeline_of(trace: dict, tree: EventTree, step: int, max_spans: int = DEFAULT_MAX_SPANS) -> Timeline:
    """The cycle's timeline from its trace and the event tree of `raw_events_from_chrome_trace(trace)`
    (`_read_cycle` aggregated from it): the span tree the callback logs for the same cycle."""
    inputs = timeline_inputs_from_chrome_trace(trace, tree.raw)
    return build_timeline(tree.raw, cycle_step=step, max_spans=max_spans, inputs=inputs, tree=tree)


def weak_attribution(linking: _chrome.Linking) -> str | None:
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


def step_of(trace: dict, fallback: int) -> int:
    """The step the callback would have logged this cycle at: the last ProfilerStep + 1."""
    steps = [int(m.group(1)) for e in trace["traceEvents"] if (m := _STEP_EVENT.match(str(e.get("name", ""))))]
    return max(steps) + 1 if steps else fallback


def ingest(path: Path, run: RunRef, *, top_k: int = 50, max_file_bytes: int | None = None, out=None,
           log_timeline: bool = True, timeline_max_spans: int = DEFAULT_MAX_SPANS) -> tuple[str, int]:  # fmt: skip
    """Logs every cycle under `path` into `run`; returns (run id, cycles logged). With
    `log_timeline`, each cycle is also a trace, as the callback logs it."""
    out = out or sys.stdout
    logger, keys = RunLogger(run), OpKeys()
    cycles = find_cycles(path)
    for index, cycle in enumerate(cycles, 1):
        trace = load_trace(cycle.trace)
        step = step_of(trace, index)
        profile, linking, tree = _read_cycle(trace, cycle.trace, max(step - 1, 0))
        attribution = linking.as_dict()
        weak = weak_attribution(linking)
        if weak:
            attribution["warning"] = weak
            warnings.warn(f"mlflow-neuron: {cycle.trace}: {weak}", MLflowNeuronWarning, stacklevel=2)
        record = _record_for(cycle, trace, profile, step, keys, top_k, max_file_bytes, first=index == 1,
                             attribution=attribution)  # fmt: skip
        if log_timeline:
            try:
                record.timeline = timeline_of(trace, tree, step, timeline_max_spans)
            except Exception as error:  # noqa: BLE001 - as in the callback: the rest of the cycle goes
                warnings.warn(f"mlflow-neuron: {cycle.trace}: no timeline (no trace is logged for step {step}): "
                              f"{type(error).__name__}: {error}", MLflowNeuronWarning, stacklevel=2)  # fmt: skip
        del tree
        delivery = record.materialize()
        try:
            _, vanished = logger.deliver(delivery)
            files = sent_files(delivery, vanished)  # what was uploaded: generated files and the profile's own
        finally:
            shutil.rmtree(record.staged_dir, ignore_errors=True)
        print(f"[{index}/{len(cycles)}] {cycle.trace} -> step {step}: {len(profile.ops)} ops, "
              f"{len(delivery.metrics)} metrics, {len(files)} file(s), {human_size(sum(files.values()))}",
              file=out, flush=True)  # fmt: skip
    return logger.run.run_id, len(cycles)


def _record_for(cycle: TraceCycle, trace: dict, profile: CycleProfile, step: int, keys: OpKeys, top_k: int,
                max_file_bytes: int | None, first: bool, attribution: dict | None = None) -> CycleRecord:  # fmt: skip
    step_dir = f"profiler/step_{step}"
    staged = Path(tempfile.mkdtemp(prefix="mlflow-neuron-ingest-"))
    found = []
    for file in cycle.files:
        relative = file.relative_to(cycle.root).as_posix()
        size = file.stat().st_size
        decision = _files.TOO_LARGE if max_file_bytes is not None and size > max_file_bytes else _files.UPLOAD
        found.append(_files.FoundFile(file, relative, size, decision))
    table = _record.ops_table(profile, keys)
    record = CycleRecord(
        step=step,
        timestamp_ms=int(time.time() * 1000),
        artifact_dir=step_dir,
        staged_dir=staged,
        metrics=_record.split_non_finite(_record.cycle_metrics(profile, keys, top_k))[0],
        tags={_record.DEVICE_TAG: profile.device, _record.DEVICE_TIME_TAG: profile.device_time,
              "mlflow_neuron.source": "ingest"},
        params={"profiler.ingested_from": str(cycle.root or cycle.trace.parent)} if first else {},
        ops_table=table,
        step_tables=_record.step_tables(profile),
        series=_record.step_series(profile),
        key_averages=f"reconstructed from {cycle.trace} (no torch events to build torch's own table)\n"
        + table.to_string(index=False),
        uploads=tuple((str(f.path), f"{step_dir}/neuron/{f.relative_path}".rsplit("/", 1)[0])
                      for f in found if f.decision == _files.UPLOAD),
        register_table=True,
    )  # fmt: skip
    if cycle.files:  # the framework trace is one of the session's files
        trace_source = f"{step_dir}/neuron/{cycle.trace.relative_to(cycle.root).as_posix()}"
    else:
        record.raw_trace = staged / ("raw_trace.json.gz" if cycle.trace.suffix == ".gz" else "raw_trace.json")
        _files.link_or_copy(cycle.trace, record.raw_trace)
        trace_source = str(cycle.trace)
    record.manifest = _record.manifest(found, neuron_dir=f"{step_dir}/neuron", output_dir=str(cycle.root or ""),
                                       trace_source=trace_source, max_file_bytes=max_file_bytes, rank=0,
                                       attribution=attribution)
    summary_tool = _devices.neuron_summary_tool()
    if cycle.files and _devices.is_neuron_session([f.name for f in cycle.files]):
        record.summary_tool, record.summary_sessions = summary_tool, (str(cycle.trace.parent),)
    return record


def _neuron_root(path: Path) -> Path:
    """The profile output folder that Neuron's `<instance>_pid_<pid>/<timestamp>/` sits in."""
    if _devices.process_of(path.name) is not None:
        return path.parent
    if path.parent != path and _devices.process_of(path.parent.name) is not None:
        return path.parent.parent
    return path


def _tensorboard_time(path: Path) -> tuple[int, str]:
    # tensorboard_trace_handler names files <worker>.<time_ns>.pt.trace.json[.gz]
    stem = path.name.split(".pt.trace.json")[0]
    number = stem.rsplit(".", 1)[-1]
    return (int(number) if number.isdigit() else 0, path.name)

