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

The public NCCL jobs (NCCL_SETS: every rank's trace of one job, real NCCL kernels) are handed to
TraceLens as they are, and to HTA's `get_potential_stragglers` (1 and 2 candidates, every step):
under `nccl_sets` the reference keeps, per set, TraceLens's straggler summary (per rank its total
wait = latest start - own start summed over the matched instances, times arrived last and first),
each matched instance's kernel and per-rank wait, how TraceLens matched them (`simplified`: by
order on the stream, the trace having no process-group args), and HTA's candidates; once as
recorded and once with every `ts` of one rank's file moved by +50 ms (SHIFT). Both tools read one
clock across files, so the shifted answers are what a one-clock tool says of a skewed clock (wrong
by construction); ours must not move.

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


def _worker_files(folder: str) -> dict[int, str]:
    """A folder of `worker<rank>_....pt.trace.json.gz` files as {rank: path under FIXTURES}."""
    files = sorted((FIXTURES / folder).glob("worker*_*.json.gz"))
    return {int(f.name[len("worker"):].split("_")[0]): f"{folder}/{f.name}" for f in files}


# public NCCL jobs: one trace per rank of one job, real NCCL kernels (tests/fixtures/README.md)
NCCL_SETS = {"param_dlrm_8rank": _worker_files("multi_rank/param_dlrm_8rank")}
SETS.update(NCCL_SETS)
SHIFT = {"rank": 1, "us": 50_000.0}  # one rank's clock off by +50 ms: every `ts` of its file


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


def _tracelens(checkout: Path):
    package = types.ModuleType("TraceLens")
    package.__path__ = [str(checkout / "TraceLens")]
    sys.modules["TraceLens"] = package
    from TraceLens.NcclAnalyser.nccl_analyser import NcclAnalyser

    return NcclAnalyser


def _load(name: str, shift_us: float = 0.0) -> dict:
    with gzip.open(FIXTURES / name, "rt") as handle:
        data = json.load(handle)
    if shift_us:
        for event in data["traceEvents"]:
            if "ts" in event:
                event["ts"] = float(event["ts"]) + shift_us
    return data


def _shifted_copies(files: dict[int, str], shift: dict | None, folder: str) -> dict[int, str]:
    """{rank: absolute path}: the fixtures as they are, or with one rank's file written shifted."""
    out = {r: str(FIXTURES / name) for r, name in files.items()}
    if shift:
        path = Path(folder) / f"rank{shift['rank']}_shifted.json.gz"
        with gzip.open(path, "wt") as handle:
            json.dump(_load(files[shift["rank"]], shift["us"]), handle)
        out[shift["rank"]] = str(path)
    return out


def tracelens_nccl_figures(checkout: Path, files: dict[int, str], shift: dict | None = None) -> dict:
    """TraceLens's NcclAnalyser on a public NCCL job's files as they are (one rank shifted if asked)."""
    NcclAnalyser = _tracelens(checkout)
    with tempfile.TemporaryDirectory() as folder:
        paths = _shifted_copies(files, shift, folder)
        analyser = NcclAnalyser([paths[r] for r in sorted(paths)], world_size=len(paths))
        summary = analyser.build_df_straggler_summary()
        detailed = analyser.df_implicit_sync_cat_detailed
        kernels = {r: sorted(events.values(), key=lambda e: e["ts"]) for r, events in analyser.rank2trace_data.items()}
    ranks = sorted(int(r) for r in summary["rank"])
    instances = []
    for row in detailed.to_dict("records"):
        index = int(str(row["collective_id"]).rsplit("_", 1)[-1])
        waits = {str(r): float(row[f"rank_{r}_wait_time"]) for r in ranks}
        instances.append({"collective_id": str(row["collective_id"]),
                          "kernel": kernels[ranks[0]][index]["name"].split("(")[0],
                          "collective_name": row["Collective name"],
                          "last": int(min(waits, key=waits.get)), "wait_us": waits})  # fmt: skip
    return {"matching": "simplified (order on the stream)" if analyser._simplified_mode else "process group and order",
            "straggler": int(summary.iloc[0]["rank"]),
            "ranks": {str(int(row["rank"])): {"total_wait_us": float(row["total_wait_time_us"]),
                                              "times_arrived_last": int(row["times_arrived_last"]),
                                              "times_arrived_first": int(row["times_arrived_first"]),
                                              "num_collectives": int(row["num_collectives"]),
                                              "total_nccl_dur_us": float(row["total_nccl_dur_us"])}
                      for row in summary.to_dict("records")},
            "instances": instances}  # fmt: skip


def hta_stragglers(files: dict[int, str], shift: dict | None = None) -> dict:
    """HTA's get_potential_stragglers with 1 and 2 candidates (its default is 2), every ProfilerStep."""
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as folder:
        paths = _shifted_copies(files, shift, folder)
        analysis = TraceAnalysis(trace_files=paths, trace_dir=folder, include_last_profiler_step=True)
        return {"profiler_steps": [int(s) for s in analysis.get_profiler_steps()],
                "candidates_1": sorted(int(r) for r in analysis.get_potential_stragglers(num_candidates=1)),
                "candidates_2": sorted(int(r) for r in analysis.get_potential_stragglers(num_candidates=2))}  # fmt: skip


def nccl_set_figures(checkout: Path | None, files: dict[int, str]) -> dict:
    out = {"shift": SHIFT}
    for variant, shift in (("as_recorded", None), (f"rank{SHIFT['rank']}_plus_50ms", SHIFT)):
        out[variant] = {"hta": hta_stragglers(files, shift),
                        "tracelens": tracelens_nccl_figures(checkout, files, shift) if checkout else None}  # fmt: skip
    return out


def tracelens_figures(checkout: Path, files: dict[int, str]) -> dict[str, dict]:
    NcclAnalyser = _tracelens(checkout)

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


def our_waits(files: dict[int, str], name: str | None = "all_reduce", shift: dict | None = None):
    """Our straggler and each rank's total wait: in `name` instances, or in every matched one (None)."""
    from mlflow_neuron._analysis.ranks.analysis import analyze
    from mlflow_neuron._trace.collectives import rank_summary_from_chrome

    report = analyze([rank_summary_from_chrome(_load(f, shift["us"] if shift and r == shift["rank"] else 0.0), rank=r)
                      for r, f in files.items()])  # fmt: skip
    rows = report.instances if name is None else report.instances[report.instances["name"] == name]
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
                 if checkout else {},
                 "nccl_sets": {name: nccl_set_figures(checkout, files) for name, files in NCCL_SETS.items()}}  # fmt: skip
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
    print()
    print("Public NCCL jobs: HTA's and TraceLens's stragglers and TraceLens's wait (µs) beside ours")
    for name, files in NCCL_SETS.items():
        entry = reference.get("nccl_sets", {}).get(name)
        if not entry:
            continue
        for variant, figures in entry.items():
            if variant == "shift":
                continue
            shift = entry["shift"] if variant != "as_recorded" else None
            straggler, mine = our_waits(files, name=None, shift=shift)
            lens = figures["tracelens"]
            print(f"{name} {variant}: HTA's candidates {figures['hta']['candidates_1']} (2: {figures['hta']['candidates_2']}), "
                  f"TraceLens's straggler {lens['straggler'] if lens else '-'} ({lens['matching'] if lens else 'not run'}), "
                  f"ours {'none' if straggler is None else f'rank {straggler}'}")  # fmt: skip
            if not lens:
                continue
            reduce_ids = [i for i, row in enumerate(lens["instances"]) if "AllReduce" in row["kernel"]]
            print(f"  {'rank':>4} {'TraceLens, all ' + str(len(lens['instances'])):>18} {'TraceLens, AllReduce':>21} "
                  f"{'ours (matched)':>15} {'TraceLens: last':>16}")  # fmt: skip
            for rank, row in sorted(lens["ranks"].items(), key=lambda kv: int(kv[0])):
                reduce_wait = sum(lens["instances"][i]["wait_us"][rank] for i in reduce_ids)
                print(f"  {rank:>4} {row['total_wait_us']:18.0f} {reduce_wait:21.0f} {mine.get(rank, 0.0):15.0f} "
                      f"{row['times_arrived_last']:>16}")  # fmt: skip


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
