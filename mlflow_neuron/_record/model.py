"""What a cycle sends, as plain data: the run it goes to, the delivery, and the names it is
logged under. Standard library only: the command line and the outbox read it before anything else.

A `Delivery` can be sent now, retried, or stored in the outbox and replayed later; sending it twice
leaves the same data once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Run tags.
DEVICE_TAG = "mlflow_neuron.device"  # neuron | cuda | cpu (ingest also: rocm | xpu | mtia)
DEVICE_TIME_TAG = "mlflow_neuron.device_time"  # present | missing | not_profiled
RUN_KEY_TAG = "mlflow_neuron.run_key"  # a run the callback creates, found again by this key
SOURCE_TAG = "mlflow_neuron.source"  # "ingest" for runs logged from traces made elsewhere
# the variants of one `interleaved()` call share this tag (a random id): their cycles ran in rotation
ROTATION_TAG = "mlflow_neuron.rotation"
# Why the cycle at a step was captured ("baseline", "step time 21.0 → 35.2 ms from step 300"): the
# callback's own schedule (`_capture.adaptive`) sets it, one tag a cycle; also in its manifest.json.
CAPTURE_REASON_TAG = "mlflow_neuron.capture_reason.step_{step}"
STEP_TIME_METRIC = "profiler/step_time_ms"  # that schedule's step time between captures: a median of steps
SPIKE_METRIC = "profiler/step_time_spike_ms"  # one step far above the step time (a checkpoint save), at its step

# Where a cycle's files go: the only spelling of these folders (`cycle_dir`, `neuron_dir`, `cycle_of_dir`).
PROFILER_FOLDER = "profiler"  # everything a cycle logs as files lies below it
CYCLE_DIR = PROFILER_FOLDER + "/step_{step}"  # rank 0's files; another rank's under CYCLE_DIR/rank_<r>
NEURON_DIR = "neuron"  # the Neuron session folders of every rank, under CYCLE_DIR, their layout kept
_CAPTURE_REASON_RE = re.compile("^" + re.escape(CAPTURE_REASON_TAG).replace(re.escape("{step}"), r"(\d+)") + "$")
_CYCLE_DIR_RE = re.compile("^" + re.escape(CYCLE_DIR).replace(re.escape("{step}"), r"(\d+)") + "$")

# Files of a cycle, under CYCLE_DIR (rank 0) or CYCLE_DIR/rank_<r>/.
OPS_TABLE = "ops.json"  # every op: the log_table layout, a sortable table in the UI
STEPS_TABLE = "steps.json"  # per-step samples: one row per (profiler step, op)
STEP_TOTALS_TABLE = "step_totals.json"  # one row per profiler step: its totals and top-level ATen calls
REGION_OPS_TABLE = "region_ops.json"  # per (profiler step, record_function region): the ops and kernels inside
KEY_AVERAGES = "key_averages.txt"  # the op table in torch's text layout
TIMELINE = "timeline.json"  # the cycle's span tree (`_trace.timeline.Timeline`): the MLflow trace, the report's SVG
# The timeline as the MLflow trace's data, under a stand-in trace id (`trace_text`): not an artifact
TRACE_SPANS = ".trace_spans.json"
TRACE = "trace.json.gz"  # the framework trace, when no Neuron session folder holds one
MANIFEST = "manifest.json"  # every file found, where it went, its checksum; NTFFs with their NEFFs
# Every rank's compact summary of each cycle (`_trace.collectives`). The callback sends one
# columnar file per node per cycle, NODE_FILE (`node_file`: every local rank's summary of the
# cycle), made by the node's consumer; `ingest` sends such files too (`_capture.ingest_nodes`). Runs
# profiled before node files hold one JSON file per rank per cycle, RANK_SUMMARY. Readers read both. In a cycle's files the rank's own summary lies
# as RANK_SUMMARY_FILE until it is sent (or handed to its node's file, `Delivery.rank_part`).
RANKS_FOLDER = PROFILER_FOLDER + "/ranks"
RANK_SUMMARY_NAME = "rank_{rank}/cycle_{step}.json"  # under RANKS_FOLDER
RANK_SUMMARY = f"{RANKS_FOLDER}/{RANK_SUMMARY_NAME}"
RANK_SUMMARY_FILE = "rank_summary.json"
RANK_MANIFEST_FILE = "rank_manifest.json"  # a rank that uploads nothing: its manifest rides in its node's file
_RANK_SUMMARY_RE = re.compile("^" + re.escape(RANK_SUMMARY_NAME).replace(re.escape("{rank}"), r"(\d+)")
                              .replace(re.escape("{step}"), r"(\d+)") + "$")  # fmt: skip
# `<host>`: the node's host name (letters, digits, `.`, `-`, `_`; anything else `_`); `<first>`:
# the lowest rank in the file, so that two outboxes on one host, or a rank's summary that came
# after its node's file was sent, never overwrite another file of the same cycle.
NODE_FILE_NAME = "node_{host}/cycle_{step}_rank_{first}.parquet"  # under RANKS_FOLDER
NODE_FILE = f"{RANKS_FOLDER}/{NODE_FILE_NAME}"
_NODE_FILE_RE = re.compile(r"^node_([A-Za-z0-9._-]+)/cycle_(\d+)_rank_(\d+)\.parquet$")
# Every rank's collectives as one table, a row per record ("rank" and "cycle" say whose): the
# columns of a node file's table (`node_file`) and of the read side's table (`_analysis.ranks.frames`).
FRAME_COLUMNS = ["rank", "cycle", "name", "group", "members", "desc", "seq", "step", "start_us", "end_us", "bytes",
                 "peer", "peer_index", "lane", "unplaced"]  # fmt: skip
# What `mlflow-neuron ranks --log-to` writes on a run: metrics, a tag, files under RANKS_LOGGED_FOLDER.
RANKS_STRAGGLER_METRIC = "profiler/ranks/straggler"  # the straggler's rank; NO_STRAGGLER where none stands out
RANKS_SKEW_METRIC = "profiler/ranks/step_time_skew_pct"
RANKS_WAIT_METRIC = "profiler/ranks/median_wait_us"
NO_STRAGGLER = -1
STRAGGLER_HOST_TAG = "mlflow_neuron.ranks.straggler_host"
RANKS_LOGGED_FOLDER = "ranks"

# The host during each profiled window (`CycleJob.host`, by these names): logged as
# `system/profile/<name>` at the cycle's step and as `host_<name>` columns of step_totals.json.
HOST_METRIC_PREFIX = "system/profile/"
HOST_COLUMN_PREFIX = "host_"
HOST_VALUES = ("other_cpu_cores", "other_cpu_s", "child_processes_cpu_cores", "child_processes_cpu_s", "span_s",
               "reach_back_s", "load_average_1m", "cpu_count", "cpu_frequency_mhz", "torch_threads", "window_s")  # fmt: skip
NEURON_UTILIZATION = "neuron_utilization_percentage"  # only where neuron-monitor ran during the window

SELF_DEVICE_TIME, SELF_CPU_TIME = "self_device_time_us", "self_cpu_time_us"  # metric names, table columns
PER_OP_METRICS = (SELF_DEVICE_TIME, SELF_CPU_TIME, "calls")  # profiler/<metric>/<op>
STEP_METRICS = (SELF_DEVICE_TIME, SELF_CPU_TIME)  # profiler/step/<metric>, one point per step
# profiler/<metric>/<region>: a record_function range's inclusive time, summed over the cycle's steps
REGION_METRICS = ("region_device_time_us", "region_cpu_time_us")
REGION = "region"  # the kind of a region's rows in ops.json and steps.json
# profile_memory=True: profiler/step/peak_memory_bytes/<device> per step, and step_totals.json's
# peak_memory_bytes_<device> columns (bytes above the step's starting level: `_trace.memory`)
PEAK_MEMORY = "peak_memory_bytes"


def cycle_dir(step: int, rank: int | None = None) -> str:
    """The artifact folder of the cycle logged at `step` (rank 0's), or `rank`'s own folder below it."""
    return CYCLE_DIR.format(step=step) + (f"/rank_{rank}" if rank is not None else "")


def neuron_dir(step: int) -> str:
    """The artifact folder of the cycle's Neuron session folders."""
    return f"{cycle_dir(step)}/{NEURON_DIR}"


def cycle_of_dir(path: str) -> int | None:
    """The step of a cycle's artifact folder (`cycle_dir`), or None for any other path."""
    found = _CYCLE_DIR_RE.match(path)
    return int(found.group(1)) if found else None


def capture_reasons(tags: Mapping[str, str]) -> dict[int, str]:
    """{step: why its cycle was captured} from a run's tags (`CAPTURE_REASON_TAG`), by step; {}
    for a run profiled on a schedule of its own."""
    found = ((_CAPTURE_REASON_RE.match(key), value) for key, value in tags.items())
    return dict(sorted((int(match.group(1)), value) for match, value in found if match))


def rank_summary_of(name: str) -> tuple[int, int] | None:
    """(rank, step) of a path under RANKS_FOLDER named as RANK_SUMMARY_NAME, or None."""
    found = _RANK_SUMMARY_RE.match(name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def node_file(host: str | None, step: int, first: int) -> str:
    """The artifact path of a node's file of the cycle logged at `step` whose lowest rank is `first`."""
    return NODE_FILE.format(host=re.sub(r"[^A-Za-z0-9._-]", "_", host or "") or "unknown", step=step, first=first)


def node_file_of(name: str) -> tuple[str, int, int] | None:
    """(host, step, lowest rank) of a path under RANKS_FOLDER named as NODE_FILE_NAME, or None."""
    found = _NODE_FILE_RE.match(name)
    return (found.group(1), int(found.group(2)), int(found.group(3))) if found else None


@dataclass(frozen=True)
class RunRef:
    """Which run a delivery belongs to. A run the callback creates itself is known, until it
    exists, by `run_key` (a tag), so that replaying from the outbox creates it only once."""

    tracking_uri: str
    run_id: str | None = None
    experiment_id: str | None = None
    run_name: str | None = None
    run_key: str | None = None


@dataclass(frozen=True)
class Delivery:
    """A cycle ready to send: its files lie on disk, the rest is in these fields."""

    step: int
    timestamp_ms: int
    artifact_dir: str  # "profiler/step_<N>" (rank 0) or "profiler/step_<N>/rank_<r>"
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    files_dir: str | None = None  # generated files, uploaded as they lie under artifact_dir
    uploads: tuple[tuple[str, str], ...] = ()  # (local file, artifact folder relative to the run)
    table: str | None = None  # artifact path of an ops table to register for the UI
    series: tuple[tuple[str, float, int], ...] = ()  # (key, value, step): points at steps of their own
    timeline: str | None = None  # a file in files_dir holding the cycle's Timeline, logged as a trace
    trace_spans: str | None = None  # a file in files_dir holding that trace's data (`TRACE_SPANS`), or None
    # The run's summary over every cycle known when it was made (`run_summary`), logged at
    # `summary_at` = (the run's highest cycle step known then, the time it was made): the run's
    # latest value is the one made last, over the most cycles.
    summary: tuple[tuple[str, float], ...] = ()
    summary_at: tuple[int, int] | None = None
    # (file in files_dir, its artifact path in the run): generated files logged outside artifact_dir
    placed: tuple[tuple[str, str], ...] = ()
    # (summary file, manifest file or None) in files_dir: the rank's summary of the cycle, for its
    # node's file (and, for a rank that uploads nothing, its manifest); the drain takes them out
    # before the delivery is recorded (`_delivery.node_parts`), so no record holds it
    rank_part: tuple[str, str | None] | None = None
