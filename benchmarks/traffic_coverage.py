"""How much of each public trace's kernel time gets bytes from the traffic formulas.

    PYTHONPATH=. python benchmarks/traffic_coverage.py [--shown 4]

Per trace in tests/fixtures/real_traces (recorded on real GPUs, with shapes): each kernel's time
goes to the innermost op that launched it (its self device time, as `_trace.event_tree` links
them); the covered share is the part whose call has a non-empty `bytes`. Prints a Markdown table
with the largest ops without bytes (a collective is covered by its message size). Run against
another checkout (PYTHONPATH=that checkout) for a before/after comparison: where that checkout's `_trace.traffic` has no `traffic_coverage`, the same
sum is made here from `event_traffic`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mlflow_neuron._trace import traffic
from mlflow_neuron._trace.chrome import read_chrome_file
from mlflow_neuron._trace.event_tree import event_tree

TRACES = {
    "mi300 normalization": "tracelens_rocm_mi300_normalization.json.gz",
    "CUDA training step, 2022": "hta_cuda_trace_diff_control_2022.json.gz",
    "H100 BERT": "tracelens_cuda_h100_bert_small.json.gz",
    "MI250 toy": "hta_rocm62_mi250_minitoy.json.gz",
}
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "real_traces"


def coverage(path: Path) -> tuple[float, list[tuple[str, float]]]:
    """(% of op kernel time with bytes, [(op, % without bytes), ...] largest first)."""
    cycle = read_chrome_file(path)
    raw, tree = cycle.raw, event_tree(cycle.raw)
    columns = traffic.event_traffic(raw, tree, cycle.inputs.op_inputs)
    nbytes = columns[0]
    order = tree.order
    rows = np.flatnonzero(tree.survivor & tree.sync_host & ~raw.is_async[order] & ~raw.is_user_annotation[order])
    if hasattr(traffic, "traffic_coverage"):  # before collectives' message sizes, it took the bytes alone
        found = traffic.traffic_coverage(columns if len(columns) > 3 else nbytes, tree.self_device_us, rows, tree.name, tree.names)  # fmt: skip
        total, covered, uncovered = found.total_us, found.covered_us, list(found.uncovered)
    else:
        time, known = tree.self_device_us[rows], np.isfinite(nbytes[rows])
        total, covered, sums = time.sum(), time[known].sum(), {}
        for row, t in zip(rows[~known].tolist(), time[~known].tolist()):
            sums[tree.names[tree.name[row]]] = sums.get(tree.names[tree.name[row]], 0.0) + t
        uncovered = sorted(((n, t) for n, t in sums.items() if t > 0), key=lambda p: (-p[1], p[0]))
    return 100 * covered / total, [(name, 100 * t / total) for name, t in uncovered]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shown", type=int, default=4, help="largest uncovered ops named per trace")
    args = parser.parse_args()
    print("| trace | covered | largest uncovered (% of op kernel time) |")
    print("|---|---|---|")
    for label, name in TRACES.items():
        pct, uncovered = coverage(FIXTURES / name)
        named = ", ".join(f"`{op}` {share:.1f}%" for op, share in uncovered[: args.shown]) or "none"
        print(f"| {label} | {pct:.1f}% | {named} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
