"""The anchors' own figures for the multi-rank fixtures, and ours beside them.

    pip install HolisticTraceAnalysis            # the `test` extra; MIT; never a dependency
    git clone https://github.com/AMD-AGI/TraceLens /tmp/TraceLens   # MIT; the commit is recorded
    python benchmarks/hta_agreement.py --write --tracelens /tmp/TraceLens   # regenerate the reference
    python benchmarks/hta_agreement.py                                      # the agreement table

`--write` runs HolisticTraceAnalysis (`get_temporal_breakdown`, `get_comm_comp_overlap`) on every
trace set below, once with its default filter (the last `ProfilerStep` dropped) and once with
`include_last_profiler_step=True`, and TraceLens's `NcclAnalyser.build_df_straggler_summary` on the
gloo sets, and stores their figures in tests/fixtures/multi_rank/reference.json, which
tests/test_ranks_analysis.py checks ours against. TraceLens reads only `kernel` events that look
like NCCL's: each set's `gloo:all_reduce` spans are handed to it as such kernels (name
`ncclDevKernel_AllReduce_gloo`, `Collective name` allreduce, one process group), nothing else
changed; its other collectives (barrier) it would leave out anyway.

Without `--write` it prints, per trace set and rank, HTA's idle / compute / non-compute shares and
the overlap beside ours (each from `rank_summary_from_chrome`'s steps, summed), and TraceLens's
straggler and total wait beside ours (from `_analysis.ranks.analysis.analyze`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
REFERENCE = FIXTURES / "multi_rank" / "reference.json"
# trace set -> {rank: file}; single-rank public traces count as a set of one
SETS = {
    "hta_sampled_2rank": {0: "multi_rank/hta_sampled_2rank/sampled_rank-0.json.gz",
                          1: "multi_rank/hta_sampled_2rank/sampled_rank-1.json.gz"},
    "hta_cuda_alexnet_2023": {0: "real_traces/hta_cuda_alexnet_2023.json.gz"},
    "hta_cuda_trace_diff_control_2022": {0: "real_traces/hta_cuda_trace_diff_control_2022.json.gz"},
    "hta_rocm62_mi250_minitoy": {0: "real_traces/hta_rocm62_mi250_minitoy.json.gz"},
    "tracelens_rocm_mi300_normalization": {0: "real_traces/tracelens_rocm_mi300_normalization.json.gz"},
    "tracelens_cuda_h100_bert_small": {0: "real_traces/tracelens_cuda_h100_bert_small.json.gz"},
}  # fmt: skip
GLOO_SETS = {name: {r: f"multi_rank/{name}/rank{r}.json.gz" for r in range(4)}
             for name in ("gloo_4rank_slow2", "gloo_4rank_even")}  # fmt: skip


def hta_figures(files: dict[int, str], include_last: bool) -> dict[str, dict]:
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_files={r: str(FIXTURES / f) for r, f in files.items()}, trace_dir=str(FIXTURES),
                             include_last_profiler_step=include_last)  # fmt: skip
    breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    out = {}
    for rank in files:
        row = breakdown.loc[rank]
        out[str(rank)] = {"idle_pct": _pct(row["idle_time(us)"], row["kernel_time(us)"]),
                          "compute_pct": _pct(row["compute_time(us)"], row["kernel_time(us)"]),
                          "non_compute_pct": _pct(row["non_compute_time(us)"], row["kernel_time(us)"]),
                          "overlap_pct": _number(overlap.loc[rank]["comp_comm_overlap_pctg"])}  # fmt: skip
    return out


def tracelens_figures(checkout: Path, files: dict[int, str]) -> dict[str, dict]:
    package = types.ModuleType("TraceLens")
    package.__path__ = [str(checkout / "TraceLens")]
    sys.modules["TraceLens"] = package
    from TraceLens.NcclAnalyser.nccl_analyser import NcclAnalyser

    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for rank, name in sorted(files.items()):
            with gzip.open(FIXTURES / name, "rt") as handle:
                events = json.load(handle)["traceEvents"]
            kernels = [{**e, "name": "ncclDevKernel_AllReduce_gloo", "cat": "kernel",
                        "args": {**e.get("args", {}), "Collective name": "allreduce", "Process Group Name": "0",
                                 "stream": 0, "correlation": i}}
                       for i, e in enumerate(events) if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce"]  # fmt: skip
            path = Path(folder) / f"rank{rank}.json"
            path.write_text(json.dumps({"traceEvents": kernels}))
            paths.append(str(path))
        summary = NcclAnalyser(paths, world_size=len(paths)).build_df_straggler_summary()
    return {str(int(row["rank"])): {"total_wait_us": float(row["total_wait_time_us"]),
                                    "times_arrived_last": int(row["times_arrived_last"]),
                                    "num_collectives": int(row["num_collectives"])}
            for row in summary.to_dict("records")}  # fmt: skip


def ours(files: dict[int, str], include_last: bool) -> dict[str, dict]:
    """Our per-rank shares over the same steps: every step, or all but the last (HTA's default)."""
    from mlflow_neuron._trace.collectives import rank_summary_from_chrome

    out = {}
    for rank, name in files.items():
        steps = [s for s in rank_summary_from_chrome(FIXTURES / name)["steps"] if s["window_us"]]
        if not include_last and len(steps) >= 2:
            steps = steps[:-1]
        total = lambda key: sum(s[key] for s in steps)  # noqa: E731
        window = total("window_us")
        comm = total("collective_us")
        out[str(rank)] = {"idle_pct": _pct(total("idle_us"), window), "compute_pct": _pct(total("compute_us"), window),
                          "non_compute_pct": _pct(window - total("idle_us") - total("compute_us"), window),
                          "overlap_pct": _pct(comm - total("exposed_comm_us"), comm) if comm else None}  # fmt: skip
    return out


def our_waits(files: dict[int, str]) -> tuple[int | None, dict[str, float]]:
    from mlflow_neuron._analysis.ranks.analysis import analyze
    from mlflow_neuron._trace.collectives import rank_summary_from_chrome

    report = analyze([rank_summary_from_chrome(FIXTURES / f) for f in files.values()])
    rows = report.instances[report.instances["name"] == "all_reduce"]
    totals = rows.groupby("rank")["wait_us"].sum()
    return (report.straggler or {}).get("rank"), {str(r): float(w) for r, w in totals.items()}


def tracelens_straggler(figures: dict[str, dict]) -> int:
    """TraceLens's straggler: the rank with the lowest total wait (its summary's first row)."""
    return int(min(figures, key=lambda r: figures[r]["total_wait_us"]))


def _pct(part, whole) -> float | None:
    return round(100.0 * float(part) / float(whole), 3) if whole and part == part else None


def _number(value) -> float | None:
    return None if value is None or value != value else round(float(value), 3)  # NaN: HTA's 0/0


def write(checkout: Path | None) -> None:
    logging.disable(logging.WARNING)
    import hta

    commit = ""
    if checkout:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()  # fmt: skip
    reference = {"source": {"hta": f"HolisticTraceAnalysis {getattr(hta, '__version__', '0.5.0')} (PyPI, MIT)",
                            "tracelens": f"AMD-AGI/TraceLens @ {commit or 'not run'} (MIT), NcclAnalyser"},
                 "hta": {name: {"default": hta_figures(files, False), "include_last_step": hta_figures(files, True)}
                         for name, files in SETS.items()},
                 "tracelens": {name: tracelens_figures(checkout, files) for name, files in GLOO_SETS.items()}
                 if checkout else {}}  # fmt: skip
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")
    print(f"wrote {REFERENCE.relative_to(ROOT)}")


def show() -> None:
    reference = json.loads(REFERENCE.read_text())
    print("HTA temporal breakdown and overlap (percentage points), theirs | ours | difference")
    print(f"{'trace set':36} {'rank':>4} {'filter':>9} {'idle':>22} {'compute':>22} {'non-compute':>22} {'overlap':>22}")
    worst = 0.0
    for name, files in SETS.items():
        for variant, include_last in (("default", False), ("all steps", True)):
            theirs = reference["hta"][name]["default" if not include_last else "include_last_step"]
            mine = ours(files, include_last)
            for rank in theirs:
                cells = []
                for key in ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct"):
                    a, b = theirs[rank][key], mine[rank][key]
                    if a is None or b is None:
                        cells.append(f"{'-':>22}")
                        continue
                    worst = max(worst, abs(a - b))
                    cells.append(f"{a:7.2f} | {b:6.2f} | {b - a:+5.2f}")
                print(f"{name:36} {rank:>4} {variant:>9} " + " ".join(f"{c:>22}" for c in cells))
    print(f"largest difference: {worst:.2f} percentage points")
    print()
    print("TraceLens straggler and each rank's total wait in all_reduce (µs), theirs | ours | difference")
    for name, files in GLOO_SETS.items():
        theirs = reference["tracelens"].get(name)
        if not theirs:
            continue
        straggler, waits = our_waits(files)
        print(f"{name}: TraceLens's straggler (lowest total wait) rank {tracelens_straggler(theirs)}, ours "
              f"{'none' if straggler is None else f'rank {straggler}'}")  # fmt: skip
        top = max(t["total_wait_us"] for t in theirs.values())
        for rank, figures in sorted(theirs.items()):
            a, b = figures["total_wait_us"], waits.get(rank, 0.0)
            print(f"  rank {rank}: {a:10.0f} | {b:10.0f} | {100 * (b - a) / top:+6.1f}% of the largest")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="run HTA (and TraceLens) and store their figures")
    parser.add_argument("--tracelens", type=Path, help="a checkout of AMD-AGI/TraceLens (with --write)")
    args = parser.parse_args()
    if args.write:
        write(args.tracelens)
    show()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
