"""Calibration of `history`'s change points on synthetic series: what the README quotes.

    python benchmarks/history_calibration.py [--series 200] [--seed 0]

Each series has 10-40 runs (uniform) of 10 steps; a step is one kernel of 100 us with uniform
±30% jitter and a 2% chance of a 10x stall (`tests/synthetic_steps.py`, as
`benchmarks/stats_calibration.py`). Kinds:

- flat; one +10% step; one +30% step (after a run drawn uniformly with at least 3 runs on each
  side); a slow drift (+30% over the series, linearly); one outlier run (1.5x); two steps (+30%,
  then back down, each at least 3 runs from the ends and from each other).

Printed per kind: the share of series that report any change, and for the steps the share found
at the right run, found within one run, and the mean position error (runs) of those found within
three runs; and the share of series where `history`'s bulk path (levels from summary metrics,
each candidate judged on at most `history.WINDOW` runs of each side) reports the same changes, at
the same runs, as the tables' path (whole segments).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlflow_neuron._analysis.changes import PENALTY, change_points, confirmed  # noqa: E402
from mlflow_neuron._report.history import WINDOW  # noqa: E402
from mlflow_neuron._trace.step_summary import level  # noqa: E402
from synthetic_steps import Noise, steps  # noqa: E402

KINDS = ("flat", "+10% step", "+30% step", "slow drift", "outlier run", "two steps")


def series(rng: np.random.Generator, kind: str) -> tuple[list[np.ndarray], list[int]]:
    """The runs of one series, and where its true changes are (the first run after each)."""
    n = int(rng.integers(10, 41))
    scale, truth = np.ones(n), []
    if kind in ("+10% step", "+30% step"):
        at = int(rng.integers(3, n - 2))
        scale[at:], truth = (1.1 if kind == "+10% step" else 1.3), [at]
    elif kind == "slow drift":
        scale = 1 + 0.3 * np.arange(n) / (n - 1)
    elif kind == "outlier run":
        scale[int(rng.integers(0, n))] = 1.5
    elif kind == "two steps":
        first = int(rng.integers(3, n // 2 - 1))
        second = int(rng.integers(max(first + 3, n // 2), n - 2))
        scale[first:second], truth = 1.3, [first, second]
    return [steps(rng, 10, Noise(), s) for s in scale], truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--penalty", type=float, default=PENALTY, help="PELT's penalty, x sigma^2 log(n) (default: %(default)s)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(f"{args.series} series per kind, 10-40 runs of 10 steps, noise ±30% and 2% stalls, penalty {args.penalty:g}")
    print("| series | report any change | step found at its run | within one run | mean error (runs) | bulk path agrees |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        any_change, exact, near, errors, steps_total, same = 0, 0, 0, [], 0, 0
        for _ in range(args.series):
            runs, truth = series(rng, kind)
            found = [c.at for c in change_points(runs, penalty=args.penalty)]
            bulk = [c.at for c in confirmed(np.array([level(r) for r in runs]), runs.__getitem__,
                                            penalty=args.penalty, window=WINDOW).changes]  # fmt: skip
            same += found == bulk
            any_change += bool(found)
            for at in truth:
                steps_total += 1
                if found:
                    error = min(abs(f - at) for f in found)
                    exact, near = exact + (error == 0), near + (error <= 1)
                    errors.append(error) if error <= 3 else None
        share = lambda k: f"{k / steps_total:.1%}" if steps_total else "-"  # noqa: E731
        mean = f"{np.mean(errors):.2f}" if errors else "-"
        print(f"| {kind} | {any_change / args.series:.1%} | {share(exact)} | {share(near)} | {mean} | "
              f"{same / args.series:.1%} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
