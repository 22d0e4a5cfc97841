"""The words and shapes a comparison shares (pure; of the package, it imports only `_record.model`'s names).

Every other `_analysis` module reads its constants and types from here, so none of them has to
import another only for a name: metric names, the TOTAL row, verdict words, where samples came
from, the sample tables' columns, and the two dataclasses that cross modules (`RunProfile`, what
a comparison needs from a run; `Regression`, what the gate found).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .._record.model import PEAK_MEMORY, SELF_CPU_TIME, SELF_DEVICE_TIME

DEVICE_METRIC, CPU_METRIC = SELF_DEVICE_TIME, SELF_CPU_TIME  # the names logged (`_record.model`)
MEMORY_METRIC = PEAK_MEMORY  # per step: the peak above the step's starting level (profile_memory=True)
METRICS = (DEVICE_METRIC, CPU_METRIC, MEMORY_METRIC)
FIELDS = ("time_us", "calls", "share", "delta_us", "speedup", "n", "outliers", "ratio", "ratio_low", "ratio_high",
          "unit", "verdict")
TOTAL = "TOTAL"
FASTER, SLOWER, NO_CHANGE, TOO_FEW = "faster", "slower", "no change", "too few samples"
TOO_FEW_CYCLES = "too few cycles"  # the cycles differ beyond step noise, and a run has too few of them
INCONCLUSIVE = "inconclusive"  # host time of runs that saw different host load: not judged
UNJUDGED = (TOO_FEW, TOO_FEW_CYCLES)  # no 95% interval: the gate names these rows instead of passing them
NEW, GONE, BASELINE = "new", "gone", "baseline"
ABSENT = "-"  # the op is in neither this run nor the baseline (a third run has it)
DEFAULT_NOISE_PCT = 2.0

SAMPLES_FROM_STEPS, SAMPLES_FROM_METRICS, SAMPLES_FROM_CYCLES = "steps", "metrics", "cycles"
SAMPLE_COLUMNS = ("cycle", "step", "name", DEVICE_METRIC, CPU_METRIC, "calls")
STEP_TOTAL_COLUMNS = ("cycle", "step", DEVICE_METRIC, CPU_METRIC, "aten_calls", MEMORY_METRIC)


@dataclass(frozen=True)
class RunProfile:
    """What a comparison needs from one run: its last cycle's op table and totals, and the
    per-step samples of every cycle.

    `samples`: one row per (profiler step, host op): columns `cycle` (the cycle's logged step),
    `step` (the ProfilerStep number), `name`, `self_device_time_us`, `self_cpu_time_us`, `calls`.
    `step_totals`: one row per profiler step: `cycle`, `step`, `self_device_time_us`,
    `self_cpu_time_us`, `aten_calls`. `source` says where they came from: SAMPLES_FROM_STEPS (the
    cycles' steps.json), SAMPLES_FROM_METRICS (step totals from `profiler/step/...` metrics; per-op
    samples are cycle sums / active steps), SAMPLES_FROM_CYCLES (runs logged before per-step
    samples: one sample per cycle, its sums / active steps). None: derived from `ops`/`totals`.
    `host`: the `system/profile/...` metrics averaged over the run's cycles (`other_cpu_cores`,
    `load_average_1m`, `cpu_count`, `torch_threads`, ...); empty for runs logged without them.
    """

    label: str
    run_id: str
    step: int
    ops: pd.DataFrame  # the rows of ops.json (columns name, kind, calls, self_*_time_us, ...)
    totals: dict[str, float]  # self_device_time_us, self_cpu_time_us, aten_calls, ...
    device: str = ""
    device_time: str = ""  # the run's mlflow_neuron.device_time tag
    extra: dict = field(default_factory=dict)
    samples: pd.DataFrame | None = None
    step_totals: pd.DataFrame | None = None
    source: str | None = None
    host: dict[str, float] = field(default_factory=dict)  # the host while it was profiled (see `weather`)
    # record_function regions per step (`region.REGION_COLUMNS`) and the ops inside them
    # (`region.REGION_OP_COLUMNS`), from steps.json and region_ops.json; None: none logged.
    regions: pd.DataFrame | None = None
    region_ops: pd.DataFrame | None = None


@dataclass(frozen=True)
class Regression:
    """An op (or the TOTAL) whose whole interval lies above the gate's threshold."""

    run: str
    op: str
    baseline_us: float  # medians per step
    run_us: float
    ratio: float = float("nan")
    ratio_low: float = float("nan")
    ratio_high: float = float("nan")

    @property
    def percent(self) -> float:
        ratio = self.ratio if not math.isnan(self.ratio) else self.run_us / self.baseline_us
        return (ratio - 1) * 100
