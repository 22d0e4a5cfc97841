"""How close each run came to its device's limits, from ops.json's roofline columns (pure).

Example::

    found = throughput(profiles, "rmsnorm", order)   # {run: [{"name", "achieved_gbps", ...}]}
    throughput_lines(found, "rmsnorm", throughput_missing(profiles, "rmsnorm"))
    # ["region rmsnorm: naive 12.1 GB/s (9% of peak), fused 80.4 GB/s (61% of peak)",
    #  "compiled: none, the bytes of region rmsnorm are unknown: an op inside it has no traffic formula ..."]

The figures are the last compared cycle's (ops.json: bytes over the op's or region's inclusive
time in that cycle), for the compared region, or else for the costliest ops that have them.
Runs profiled without `record_shapes=True` have none, and are left out with the reason
(`throughput_missing`), as are runs whose region has no bytes.

`bytes_coverage` says, per run, how much of the last cycle's op device time has bytes at all, and
names the largest ops without them: a GB/s figure covers only what the formulas know.
"""

from __future__ import annotations

import math

import pandas as pd

from .model import RunProfile

SHOWN_OPS = 3
UNCOVERED = "pct_device_time_without_bytes"  # ops.json's column (`_trace.roofline`)
FIELDS = ("achieved_gbps", "achieved_gflops", "pct_of_peak_bandwidth", "pct_of_peak_flops", "bound")


def throughput(profiles: list[RunProfile], region: str | None, order: list[str]) -> dict[str, list[dict]]:
    """Per run label, the roofline figures of the region, or of the first ops of `order` that have them."""
    found = {}
    for profile in profiles:
        ops = profile.ops
        if "achieved_gbps" not in ops or "kind" not in ops:
            continue
        if region is not None:
            rows = ops[(ops["kind"] == "region") & (ops["name"] == region)]
        else:
            known = ops[(ops["kind"] == "op") & ops["achieved_gbps"].notna()].set_index("name")
            names = [n for n in order if n in known.index][:SHOWN_OPS]
            rows = known.loc[names].reset_index()
        entries = [{"name": str(row["name"]), **{f: _value(row.get(f)) for f in FIELDS}} for _, row in rows.iterrows()]
        found[profile.label] = [e for e in entries if e["achieved_gbps"] is not None]
    return {label: entries for label, entries in found.items() if entries}


def throughput_missing(profiles: list[RunProfile], region: str | None) -> dict[str, str]:
    """Per run label that `throughput` leaves out, why: the reader is told, not left to guess."""
    found = {}
    for profile in profiles:
        ops = profile.ops
        if "achieved_gbps" not in ops or "kind" not in ops:
            found[profile.label] = "no bytes in its ops.json (profiled without record_shapes=True)"
        elif region is not None:
            rows = ops[(ops["kind"] == "region") & (ops["name"] == region)]
            if rows.empty:
                found[profile.label] = f"no region {region} in its last cycle"
            elif rows["achieved_gbps"].isna().all() and "bytes" in rows and rows["bytes"].notna().any():
                found[profile.label] = f"region {region} took no measurable time in its last cycle"
            elif rows["achieved_gbps"].isna().all():
                found[profile.label] = (f"the bytes of region {region} are unknown: an op inside it has no traffic "
                                        "formula (a compiled graph's kernels, for one)")  # fmt: skip
        elif not ((ops["kind"] == "op") & ops["achieved_gbps"].notna()).any():
            found[profile.label] = "none of its ops has a traffic formula"
    return found


def throughput_lines(found: dict[str, list[dict]], region: str | None, missing: dict[str, str] | None = None) -> list[str]:
    """One line per op or region: each run's achieved GB/s and its % of the peak where known; then
    one per run left out (`missing`, from `throughput_missing`), saying why."""
    names: list[str] = []
    for entries in found.values():
        names += [e["name"] for e in entries if e["name"] not in names]
    lines = []
    for name in names:
        parts = [f"{label} {_gbps(e)}" for label, entries in found.items() for e in entries if e["name"] == name]
        lines.append(f"{'region ' if region is not None else ''}{name}: {', '.join(parts)}")
    return lines + [f"{label}: none, {why}" for label, why in (missing or {}).items() if label not in found]


def _gbps(entry: dict) -> str:
    text = f"{entry['achieved_gbps']:,.1f} GB/s"
    if entry.get("pct_of_peak_bandwidth") is not None:
        bound = f", {entry['bound']}-bound" if entry.get("bound") else ""
        text += f" ({entry['pct_of_peak_bandwidth']:,.0f}% of peak bandwidth{bound})"
    return text


def _value(value):
    if value is None or (isinstance(value, float) and math.isnan(value)) or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value if isinstance(value, str) else float(value)


def bytes_coverage(profiles: list[RunProfile]) -> dict[str, dict]:
    """Per run label: {"pct": the share of op device time that has bytes, "without": [(op, % of
    device time), ...] largest first}; runs whose ops.json has no such column are left out."""
    found = {}
    for profile in profiles:
        ops = profile.ops
        if UNCOVERED not in ops or "kind" not in ops:
            continue
        rows = ops[(ops["kind"] == "op") & ops[UNCOVERED].notna()]
        if rows.empty:
            continue
        missing = rows[rows[UNCOVERED] > 0].sort_values(UNCOVERED, ascending=False, kind="stable")
        found[profile.label] = {"pct": 100.0 - float(missing[UNCOVERED].sum()),
                                "without": [(str(n), float(v)) for n, v in zip(missing["name"], missing[UNCOVERED])]}
    return found


def coverage_lines(found: dict[str, dict]) -> list[str]:
    """One line per run: "run a: 94% of op device time has bytes; without: aten::_foreach_add_ 5.7%"."""
    lines = []
    for label, entry in found.items():
        without = ", ".join(f"{name} {pct:.1f}%" for name, pct in entry["without"][:SHOWN_OPS])
        lines.append(f"{label}: {entry['pct']:.0f}% of op device time has bytes" + (f"; without: {without}" if without else ""))
    return lines
