"""What a rank summary costs the helper process per cycle, beside what reading the trace costs anyway.

    python benchmarks/rank_summary_cost.py                       # the 109,123-event CUDA trace
    python benchmarks/rank_summary_cost.py --trace tests/fixtures/real_traces/hta_mtia_rank_0.json.gz

For one real trace, in alternation (`--repeat` rounds, medians printed): the file parsed and
nothing kept (`read_pieces`, the floor for anything that reads the file); the rank summary from the
file (`rank_summary_from_chrome(path)`); the rank summary from the trace already parsed
(`rank_summary_from_chrome(dict)`: the analysis alone); and the chrome reader the helper's cycle
pipeline runs on the same file (`read_chrome_file`), for scale. Times are wall-clock on whatever
machine runs it; the ratios in one run are what compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlflow_neuron._trace.chrome import read_chrome_file  # noqa: E402
from mlflow_neuron._trace.chrome_file import read_pieces  # noqa: E402
from mlflow_neuron._trace.collectives import rank_summary_from_chrome  # noqa: E402
from mlflow_neuron._trace.json_text import parse  # noqa: E402

DEFAULT = ROOT / "tests" / "fixtures" / "real_traces" / "hta_cuda_trace_diff_control_2022.json.gz"


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import gzip

    raw = gzip.open(args.trace).read() if args.trace.suffix == ".gz" else args.trace.read_bytes()
    parsed = parse(raw)
    events = len(parsed["traceEvents"])
    runs = {"parse only": lambda: read_pieces(args.trace, lambda chunk: None, lambda: None),
            "rank summary from the file": lambda: rank_summary_from_chrome(args.trace),
            "rank summary from the parsed trace": lambda: rank_summary_from_chrome(parsed),
            "the cycle pipeline's reader": lambda: read_chrome_file(args.trace)}  # fmt: skip
    times = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, work in runs.items():
            times[name].append(timed(work))
    summary = rank_summary_from_chrome(parsed)
    print(f"{args.trace.name}: {events:,} events, {len(summary['steps'])} steps, {len(summary['collectives'])} "
          f"collectives; medians of {args.repeat} rounds")  # fmt: skip
    floor = statistics.median(times["parse only"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:36} {median:7.3f} s  {1e6 * median / events:6.2f} µs/event  {median / floor:5.2f}x parse only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
