"""A comparison in words, and op names short enough to read (pure).

The sentence is deterministic: the same frame always gives the same words, so it can sit in a
run's description or a model version's annotation and only change when the numbers do. Example:

    fused vs naive: faster, self device time −38% (95% CI −41…−35%), 5 fewer ATen calls per step;
    aten::mul accounts for 80% of the change.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from .cycles import CYCLES, MIN_CYCLES
from .model import CPU_METRIC, FASTER, MEMORY_METRIC, INCONCLUSIVE, SLOWER, TOO_FEW, TOO_FEW_CYCLES, TOTAL
from .region import inside_change

# Generated names carry long hashes (`## Call CompiledFxGraph f7xp...52 chars ##`): a token of 20+
# lowercase letters and digits with at least one digit. Identifiers with underscores never match.
_HASH = re.compile(r"\b(?=[a-z0-9]*\d)[a-z0-9]{20,}\b")
MINUS = "\u2212"


def sentence(frame: pd.DataFrame, run: str) -> str:
    base = frame.attrs["baseline"]
    total = frame.loc[TOTAL, run]
    what = {CPU_METRIC: "self CPU time", MEMORY_METRIC: "peak memory"}.get(frame.attrs["metric"], "self device time")
    region = frame.attrs.get("region")
    if region is not None:
        what = f"region {region} {'CPU' if frame.attrs['metric'] == CPU_METRIC else 'device'} time"
    verdict = total["verdict"]
    change = f"{what} {_percents(total['ratio'])[0]}%"
    noise = frame.attrs.get("cycle_noise", {}).get(run, {})
    if verdict == INCONCLUSIVE:
        return f"{run} vs {base}: {INCONCLUSIVE}: {frame.attrs['inconclusive'][run]}; {change}, not judged."
    if verdict == TOO_FEW:
        change += f" (n {frame.attrs['n'][run]} vs {frame.attrs['n'][base]}: no 95% interval)"
    elif verdict == TOO_FEW_CYCLES:
        change += (f" (its cycles differ beyond the noise between steps; an interval needs {MIN_CYCLES} cycles "
                   f"per run, {base} has {noise['cycles'][0]} and {run} {noise['cycles'][1]})")  # fmt: skip
    elif not pd.isna(total["ratio_low"]):
        low, high = _percents(total["ratio_low"], total["ratio_high"])
        why = frame.attrs.get("not_gated", {}).get(run)
        change += f" (95% CI {low}…{high}%{_unit(total['unit'], noise, why)})" if low != high else \
            f" (exact: no spread in either run{'; ' + why if why else ''})"
    parts = [f"{run} vs {base}: {verdict}, {change}"]
    calls = _calls(frame.attrs["aten_calls"].get(run), frame.attrs["aten_calls"].get(base))
    if calls:
        parts.append(f", {calls}")
    replaced = inside_change(frame, run, frame.attrs["launches"], short_name) if region is not None else ""
    if replaced:
        parts.append(f"; {replaced}")
    elif verdict in (FASTER, SLOWER, TOO_FEW, TOO_FEW_CYCLES):
        culprit = _largest_part_of_change(frame, run)
        if culprit:
            parts.append(f"; {culprit}")
    return "".join(parts) + "."


def _unit(unit: str, noise: dict, not_gated: str | None = None) -> str:
    """What the interval stands on, where it matters: cycles, or steps of too few cycles to check
    (and, for host time, why the gate does not act on it)."""
    counts = noise.get("cycles") or [0, 0]
    if not_gated:
        return f"; {not_gated}"
    if unit == CYCLES:
        return f", over {counts[0]} vs {counts[1]} cycles"
    if 0 < min(counts) < MIN_CYCLES:
        return f"; {counts[0]} vs {counts[1]} cycles, too few to check between cycles"
    return ""


def short_name(name: str, hash_chars: int = 4, width: int = 48) -> str:
    """`## Call CompiledFxGraph <hash> ##` -> `CompiledFxGraph f7xp…`; other names up to `width`."""
    text = str(name)
    if text.startswith("## ") and text.endswith(" ##"):
        text = text[3:-3].removeprefix("Call ")
    text = _HASH.sub(lambda m: m.group(0)[:hash_chars] + "…", text)
    return text if len(text) <= width else text[: width - 1] + "…"


def short_names(names: list[str]) -> list[str]:
    """`short_name` of each, with longer hash prefixes where two shortened names would collide."""
    for hash_chars in (4, 8, 16, 64):
        shown = [short_name(n, hash_chars) for n in names]
        if len(set(shown)) == len(set(names)):
            return shown
    return [str(n) for n in names]


def _percents(*ratios: float) -> list[str]:
    """Ratios as signed percent changes, all with the decimals that the largest one needs."""
    values = [(r - 1) * 100 for r in ratios]
    finite = [abs(v) for v in values if math.isfinite(v)]
    decimals = 0 if finite and max(finite) >= 10 else 1
    while decimals < 2 and any(v and round(v, decimals) == 0 for v in finite):
        decimals += 1  # "−0.4%" rather than a bound that reads "+0%"
    return [_signed(v, decimals) for v in values]


def _signed(value: float, decimals: int) -> str:
    if math.isnan(value):
        return "?"
    if math.isinf(value):
        return "+\u221e"
    if round(value, decimals) == 0:
        value = 0.0  # never "-0%"
    return f"{value:+.{decimals}f}".replace("-", MINUS)


def _calls(run: float | None, base: float | None) -> str:
    if run is None or base is None:
        return ""
    difference = run - base
    if difference == 0:
        return f"same ATen calls per step ({run:g})"
    return f"{abs(difference):g} {'more' if difference > 0 else 'fewer'} ATen calls per step"


def _largest_part_of_change(frame: pd.DataFrame, run: str) -> str:
    """The real op (not a wrapper range) that moved most in the total's direction, and its share."""
    base = frame.attrs["baseline"]
    total_change = frame.loc[TOTAL, (run, "time_us")] - frame.loc[TOTAL, (base, "time_us")]
    if not total_change or pd.isna(total_change):
        return ""
    wrappers = set(frame.attrs.get("wrappers", []))
    run_times = np.nan_to_num(frame[(run, "time_us")].to_numpy(float))  # NaN: the op is not in that run
    base_times = np.nan_to_num(frame[(base, "time_us")].to_numpy(float))
    changes = (run_times - base_times) * np.sign(total_change)
    best, best_change = None, 0.0
    for op, change in zip(frame.index, changes):
        if op != TOTAL and op not in wrappers and change > best_change:  # ties: the first, in frame order
            best, best_change = op, change
    if best is None:
        return ""
    return f"{short_name(best)} accounts for {best_change / abs(total_change) * 100:.0f}% of the change"
