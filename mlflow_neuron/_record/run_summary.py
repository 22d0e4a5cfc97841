"""A run's per-step summary over every cycle delivered so far, logged as run metrics.

`mlflow-neuron history` reads these from one paged `search_runs` instead of each run's tables
(`_report.history`). For the step's TOTAL (`self_device_time_us`, `self_cpu_time_us`) and for
each `record_function` region (`region_device_time_us`, `region_cpu_time_us`), under
`profiler/summary/`:

    profiler/summary/<metric>/{median,low,high,n_steps,geomean}
    profiler/summary/<region metric>/<region key>/{median,low,high,n_steps,geomean}

(`_trace.step_summary` defines the numbers; `low`/`high` only from 6 steps; `geomean` is
exp(level), the geometric mean of the steps that are not outliers, only where every step took
some time). Times are microseconds to the nanosecond, as every time the callback logs. A region's key is its name where that is a legal key, else the
legal form with a hash of the name (`region_key`): `history` finds it from the name alone.

**All cycles, not this one.** A run's cycles arrive one at a time, possibly prepared by several
processes over its life (the helper, the training process at close, `mlflow-neuron sync`). Every
preparer of a run already shares the run's state through the outbox (`.keys-<run>.json`, read
before and written after each cycle, removed when the run ends: `drain.prepare`); the per-step
values ride in that state (`RunSteps.export` / `absorb`: a union by (cycle, step)), so each
cycle's summary covers every cycle this outbox has prepared for the run. It is made under the
outbox's store lock and logged at the run's highest cycle step known then, timed when it was made
(`Preparer.with_run_summary`): the run's latest value (the one `search_runs` returns) is the
summary made last, over every cycle, even where two processes prepared cycles at once. Cycles prepared through another outbox are missing from it: `history` then sees the
summary disagree with the run's tables, names the run, and the tables win.
"""

from __future__ import annotations

import math

from .._trace.profile import NOT_PROFILED, CycleProfile
from .._trace.step_summary import summarize
from .keys import MAX_OP_KEY_CHARS, PREFIX, name_hash, readable_key
from .record import TIME_DECIMALS
from .model import REGION_METRICS, STEP_METRICS

SUMMARY = f"{PREFIX}/summary"
STATS = ("median", "low", "high", "n_steps", "geomean")
MAX_REGIONS = 20  # the costliest regions (CPU time over the run) get summaries; the rest stay in the tables


def region_key(name: str) -> str:
    """A region's key under `profiler/summary/`: the name where it is a legal key, else its legal
    form and a hash of the name (the same name always gets the same key, two names never one)."""
    key = readable_key(name)
    return key if key == name else f"{key[: MAX_OP_KEY_CHARS - 9]}-{name_hash(name)}"


def summary_key(metric: str, stat: str, region: str | None = None) -> str:
    """The key of one number: `metric` a STEP_METRICS name (or, with `region`, a REGION_METRICS name)."""
    return f"{SUMMARY}/{metric}/{stat}" if region is None else f"{SUMMARY}/{metric}/{region_key(region)}/{stat}"


class RunSteps:
    """Every (cycle, step) of one run seen so far: the step's totals and each region's time in it.
    Beside them, columns in the order the steps came (a region's 0 where it did not run), kept as
    steps come: a run's thousandth cycle costs no more than its tenth to summarize."""

    def __init__(self) -> None:
        self.steps: dict[str, dict] = {}  # "cycle/step" -> {"total": [device, cpu], "regions": {name: [device, cpu]}}
        self.device_profiled = False
        self.last_cycle: int | None = None  # the highest cycle step held
        self._row: dict[str, int] = {}  # a step's place in the columns
        self._totals: tuple[list[float], list[float]] = ([], [])  # (device, cpu) per step
        self._regions: dict[str, tuple[list[float], list[float]]] = {}  # name -> (device, cpu) per step
        self._ran: dict[str, int] = {}  # name -> the steps it ran in

    def add(self, cycle: int, profile: CycleProfile) -> None:
        regions: dict[int, dict[str, list[float]]] = {}
        for r in profile.regions:
            times = regions.setdefault(r.step, {}).setdefault(r.name, [0.0, 0.0])
            times[0] += r.device_time_us
            times[1] += r.cpu_time_us
        for t in profile.step_totals:
            self._put(f"{cycle}/{t.step}", {"total": [t.self_device_time_us, t.self_cpu_time_us],
                                            "regions": regions.get(t.step, {})}, replace=True)  # fmt: skip
        self.device_profiled |= profile.device_time != NOT_PROFILED

    def export(self) -> dict:
        return {"steps": self.steps, "device_profiled": self.device_profiled}

    def absorb(self, known: dict) -> None:
        """Takes the steps another preparer of the run saw (a union: a step keeps its values)."""
        for key, values in (known.get("steps") or {}).items():
            if key not in self.steps:
                self._put(key, values, replace=False)
        self.device_profiled |= bool(known.get("device_profiled"))

    def _put(self, key: str, values: dict, *, replace: bool) -> None:
        row = self._row.get(key)
        if row is not None and not replace:
            return
        cycle = key.split("/", 1)[0]
        if cycle.lstrip("-").isdigit():
            self.last_cycle = max(int(cycle), self.last_cycle if self.last_cycle is not None else int(cycle))
        if row is None:
            row = self._row[key] = len(self._totals[0])
            for column in (*self._totals, *(c for pair in self._regions.values() for c in pair)):
                column.append(0.0)
        else:  # the same cycle prepared again: its step's regions are the new ones
            for name in self.steps[key]["regions"]:
                self._ran[name] -= 1
                self._regions[name][0][row] = self._regions[name][1][row] = 0.0
        self.steps[key] = values
        self._totals[0][row], self._totals[1][row] = values["total"][0], values["total"][1]
        for name, times in values["regions"].items():
            pair = self._regions.get(name)
            if pair is None:
                pair = self._regions[name] = ([0.0] * len(self._totals[0]), [0.0] * len(self._totals[0]))
            pair[0][row], pair[1][row] = times[0], times[1]
            self._ran[name] = self._ran.get(name, 0) + 1

    def metrics(self) -> dict[str, float]:
        """The summary metrics over every step held (empty when none)."""
        if not self.steps:
            return {}
        found: dict[str, float] = {}
        device = (0,) if self.device_profiled else ()
        for index in (*device, 1):
            found.update(_numbers(self._totals[index], STEP_METRICS[index], None))
        cpu = {name: sum(pair[1]) for name, pair in self._regions.items() if self._ran[name]}
        for name in sorted(cpu, key=lambda n: (-cpu[n], n))[:MAX_REGIONS]:
            for index in (*device, 1):  # a step the region did not run in counts 0, as `compare --region` counts it
                found.update(_numbers(self._regions[name][index], REGION_METRICS[index], name))
        return found


def _numbers(values: list[float], metric: str, region: str | None) -> dict[str, float]:
    s = summarize(values)
    geomean = None if s.level is None else math.exp(s.level)
    numbers = {"median": s.median, "low": s.low, "high": s.high, "geomean": geomean}
    found = {summary_key(metric, stat, region): round(float(v), TIME_DECIMALS) for stat, v in numbers.items()
             if v is not None and math.isfinite(v)}  # fmt: skip
    return {**found, summary_key(metric, "n_steps", region): float(s.n)}
