"""The host's weather beside a comparison (pure): did two runs see the same load on their host?

Host time is what a busy host changes: a process that shares the cores with two CPU hogs runs its
ops slower, whatever the code does. Each profiled window records the CPU seconds the rest of the
host used (`system/profile/other_cpu_s`: the host's busy CPU time minus the job's) and the wall
seconds they cover (`span_s`: the window, or, for a window too short for the host's 10 ms
counters, from up to a second before its end, never into an earlier window: `reach_back_s` says
how far before the window's start), and a run's cores busy elsewhere are the sum of the one over
the sum of the other, so the rounding errors of many windows cancel. Runs without `other_cpu_s`
use the mean of their windows' `other_cpu_cores`, weighted by window length.

The job's own processes are the job, not the weather: what the training process's child
processes used (compile workers and compilers, DataLoader workers: `child_processes_cpu_s`) is
not in `other_cpu_s`, and `host_note` names it where it is large (`JOB_SHARE_SHOWN_CORES`). Runs
logged without that figure counted those processes in `other_cpu_s`, and are judged on it as
they were.

A host-time comparison cannot tell the code from the weather, and its verdicts read
`inconclusive` (`verdict_weather`), when:

- **either run's host was busy**: other processes kept more than `HOST_BUSY_SHARE` of its CPUs
  busy (25%: half a core on 2 CPUs). Below that a run's own step-to-step noise absorbs the
  load; above it, a window that shares its cores with other work is late by however much the
  scheduler decides, and two runs that both saw it (0.9 and 1.4 cores busy elsewhere on 2 CPUs)
  are not the same weather, only equally bad weather. A run without `cpu_count` is not judged
  busy;
- **or the runs' figures differ** by more than `HOST_LOAD_THRESHOLD_CORES` (0.5 cores: on a host
  with as many cores as busy threads, half a core taken elsewhere already delays every step a
  little).

Device time is judged on its own evidence: the host's load is shown beside it, never applied to it.
"""

from __future__ import annotations

import math

import pandas as pd

from .._record.model import HOST_VALUES, NEURON_UTILIZATION

HOST_LOAD_THRESHOLD_CORES = 0.5
HOST_BUSY_SHARE = 0.25  # of the host's CPUs busy elsewhere: beyond it, host time is not judged (calibrated: docs/figures.md, the gate's matrix)
JOB_SHARE_SHOWN_CORES = 0.2  # the job's own child processes' CPU is named beside the host's load from here on
OTHER_CPU, OTHER_CPU_S, SPAN_S, WINDOW_S = "other_cpu_cores", "other_cpu_s", "span_s", "window_s"
CHILD_CPU, CHILD_CPU_S, REACH_BACK_S = "child_processes_cpu_cores", "child_processes_cpu_s", "reach_back_s"
_SUMMED = {OTHER_CPU: OTHER_CPU_S, CHILD_CPU: CHILD_CPU_S}  # cores from the sum of seconds over the sum of spans
HOST_METRICS = (*HOST_VALUES, NEURON_UTILIZATION)  # logged as system/profile/<name>


def run_host(per_cycle: pd.DataFrame) -> dict[str, float]:
    """A run's host figures from one row per cycle (columns: HOST_METRICS, any may be missing):
    cores busy elsewhere and the child processes' cores as above, `reach_back_s` and `window_s`
    the longest and the median window's, the rest as means over the cycles weighted by window
    length, and `cycles`, the cycles measured."""
    if per_cycle.empty or OTHER_CPU not in per_cycle:
        return {}
    known = per_cycle[per_cycle[OTHER_CPU].notna()]
    if known.empty:
        return {}
    weights = known[WINDOW_S].fillna(0.0) if WINDOW_S in known else pd.Series(1.0, index=known.index)
    if not weights.sum() > 0:
        weights = pd.Series(1.0, index=known.index)
    host = {"cycles": float(len(known))}
    spans = known[SPAN_S] if SPAN_S in known else known.get(WINDOW_S)
    summed = {cores: seconds for cores, seconds in _SUMMED.items() if seconds in known and spans is not None
              and known[seconds].notna().all() and spans.sum() > 0}  # fmt: skip
    for name in HOST_METRICS:
        if name in (WINDOW_S, SPAN_S, REACH_BACK_S, *_SUMMED.values(), *summed) or name not in known:
            continue
        values = known[name]
        mask = values.notna()
        if mask.any():
            host[name] = float((values[mask] * weights[mask]).sum() / weights[mask].sum())
    for name, seconds in summed.items():  # the window-weighted mean above is only for runs without the seconds
        cores = float(known[seconds].sum() / spans.sum())
        host[name] = min(max(cores, 0.0), host.get("cpu_count", cores))
    if REACH_BACK_S in known and known[REACH_BACK_S].notna().any():
        host[REACH_BACK_S] = float(known[REACH_BACK_S].max())
        if WINDOW_S in known and known[WINDOW_S].notna().any():
            host[WINDOW_S] = float(known[WINDOW_S].median())
    return host


def load_differs(base: dict[str, float], run: dict[str, float], threshold: float = HOST_LOAD_THRESHOLD_CORES) -> bool:
    """Whether both runs' load is known and differs by more than `threshold` cores."""
    b, r = base.get(OTHER_CPU), run.get(OTHER_CPU)
    return b is not None and r is not None and abs(r - b) > threshold  # NaN compares False


def busy(host: dict[str, float], share: float = HOST_BUSY_SHARE) -> bool:
    """Whether other processes kept more than `share` of the host's CPUs busy (False when unknown)."""
    cores, cpus = host.get(OTHER_CPU), host.get("cpu_count")
    return cores is not None and bool(cpus) and cores > share * cpus  # NaN compares False


def verdict_weather(base_label: str, base: dict[str, float], label: str, run: dict[str, float],
                    threshold: float = HOST_LOAD_THRESHOLD_CORES, share: float = HOST_BUSY_SHARE) -> str | None:  # fmt: skip
    """Why a host-time comparison of `run` against `base` cannot be judged, or None when it can:
    `the host was busy (cand 1.4 of 2 CPUs busy elsewhere, over 25%)`, or `reason`'s words."""
    crowded = [(name, host) for name, host in ((base_label, base), (label, run)) if busy(host, share)]
    reached = _reached_back([base, run])
    if crowded:
        figures = ", ".join(f"{name} {_cores(host[OTHER_CPU])} of {host['cpu_count']:g} CPUs busy elsewhere"
                            for name, host in crowded)  # fmt: skip
        return f"the host was busy ({figures}, over {share:.0%}{'; ' + reached if reached else ''})"
    if not load_differs(base, run, threshold):
        return None
    return reason(base_label, base, label, run) + (f"; {reached}" if reached else "")


def reason(base_label: str, base: dict[str, float], label: str, run: dict[str, float]) -> str:
    """`the runs saw different host load (naive 0.1 cores busy elsewhere, fused 1.9)`."""
    return (f"the runs saw different host load ({base_label} {_cores(base[OTHER_CPU])} cores busy elsewhere, "
            f"{label} {_cores(run[OTHER_CPU])})")  # fmt: skip


def host_note(hosts: dict[str, dict[str, float]]) -> str | None:
    """One line with each run's host while it was profiled, or None when no run recorded it."""
    parts = []
    for label, host in hosts.items():
        if not host:
            parts.append(f"{label} not recorded")
            continue
        words = f"{label} {_cores(host[OTHER_CPU])} cores busy elsewhere"
        within = []
        if "load_average_1m" in host:
            cpus = f" on {host['cpu_count']:g} CPUs" if "cpu_count" in host else ""
            within.append(f"load {host['load_average_1m']:.1f}{cpus}")
        if host.get(CHILD_CPU, 0.0) >= JOB_SHARE_SHOWN_CORES:
            within.append(f"the job's own processes used {_cores(host[CHILD_CPU])} cores: its child processes, "
                          "such as compile or DataLoader workers, counted as the job")  # fmt: skip
        parts.append(words + (f" ({'; '.join(within)})" if within else ""))
    if not any(hosts.values()):
        return None
    reached = _reached_back(hosts.values())
    return "host while profiled: " + ", ".join(parts) + (f"; {reached}" if reached else "")


def _reached_back(hosts) -> str:
    """`the host's load read with up to 1.3 s before each window of 8 ms, ...` where a run's
    figures reach back before its windows' starts, else ""."""
    reached = [host for host in hosts if host.get(REACH_BACK_S, 0.0) >= 0.001]  # logged in ms
    if not reached:
        return ""
    furthest = max(host[REACH_BACK_S] for host in reached)
    shortest = min((h[WINDOW_S] for h in reached if math.isfinite(h.get(WINDOW_S, math.nan))), default=math.nan)
    windows = f" of {shortest * 1000:.0f} ms" if math.isfinite(shortest) else ""
    back = f"{furthest:.1f} s" if furthest >= 0.95 else f"{furthest * 1000:.0f} ms"
    return f"the host's load read with up to {back} before each window{windows}: its counters tick every 10 ms"


def _cores(value: float) -> str:
    return f"{value:.1f}"
