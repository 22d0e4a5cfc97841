"""What a cycle sends, as plain data: the run it goes to, the delivery, and the names it is
logged under. Standard library only: the command line and the outbox read it before anything else.

A `Delivery` can be sent now, retried, or stored in the outbox and replayed later; sending it twice
leaves the same data once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Run tags.
DEVICE_TAG = "mlflow_neuron.device"  # neuron | cuda | cpu (ingest also: rocm | xpu | mtia)
DEVICE_TIME_TAG = "mlflow_neuron.device_time"  # present | missing | not_profiled
RUN_KEY_TAG = "mlflow_neuron.run_key"  # a run the callback creates, found again by this key
SOURCE_TAG = "mlflow_neuron.source"  # "ingest" for runs logged from traces made elsewhere
# the variants of one `interleaved()` call share this tag (a random id): their cycles ran in rotation
ROTATION_TAG = "mlflow_neuron.rotation"

# Files of a cycle, under profiler/step_<N>/ (rank 0) or profiler/step_<N>/rank_<r>/.
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
# Every rank's compact summary of each cycle (`_trace.collectives`), one file per rank per cycle,
# at this artifact path; in the cycle's files it lies as RANK_SUMMARY_FILE until it is sent.
RANK_SUMMARY = "profiler/ranks/rank_{rank}/cycle_{step}.json"
RANK_SUMMARY_FILE = "rank_summary.json"

# The host during each profiled window (`CycleJob.host`, by these names): logged as
# `system/profile/<name>` at the cycle's step and as `host_<name>` columns of step_totals.json.
HOST_METRIC_PREFIX = "system/profile/"
HOST_COLUMN_PREFIX = "host_"
HOST_VALUES = ("other_cpu_cores", "other_cpu_s", "child_processes_cpu_cores", "child_processes_cpu_s", "span_s",
               "reach_back_s", "load_average_1m", "cpu_count", "cpu_frequency_mhz", "torch_threads", "window_s")  # fmt: skip
NEURON_UTILIZATION = "neuron_utilization_percentage"  # only where neuron-monitor ran during the window

PER_OP_METRICS = ("self_device_time_us", "self_cpu_time_us", "calls")  # profiler/<metric>/<op>
STEP_METRICS = ("self_device_time_us", "self_cpu_time_us")  # profiler/step/<metric>, one point per step
# profiler/<metric>/<region>: a record_function range's inclusive time, summed over the cycle's steps
REGION_METRICS = ("region_device_time_us", "region_cpu_time_us")
REGION = "region"  # the kind of a region's rows in ops.json and steps.json
# profile_memory=True: profiler/step/peak_memory_bytes/<device> per step, and step_totals.json's
# peak_memory_bytes_<device> columns (bytes above the step's starting level: `_trace.memory`)
PEAK_MEMORY = "peak_memory_bytes"


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
