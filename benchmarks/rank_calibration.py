"""How often `mlflow-neuron ranks` names the right straggler, and how often it names one when no rank
was slowed: 4-rank `torchrun` jobs (gloo, CPU), one slow rank, its delay a share of the step.

    python benchmarks/rank_calibration.py [--jobs 20] [--delays 0 0.05 0.1 0.3] [--steps 20] [--size 1536] [--why]
        [--keep DIR] [--device-ms MS]
    python benchmarks/rank_calibration.py --rejudge DIR      # the kept runs judged again (a changed rule)

Each job is `examples/ranks_straggler.py` under `torchrun --standalone --nproc-per-node 4`: per step
a matmul of side `--size` (and with `--device-ms`, a wait that stands for an accelerator's time:
the host is free meanwhile, so four ranks on two cores slow each other only in their host work), then on `--slow-rank` a sleep (`--delay-ms`), then one `all_reduce`;
every rank profiled by the callback's defaults into one run of a sqlite store, `--steps` profiled
steps in 2 cycles (a straggler needs 6 or more), with 120 s at close to deliver on a busy machine. The delay is a
share of the step: the median step of the jobs without a delay (run first), times the share. The run is then read as `ranks` reads it
(`rank_runs.read_ranks`, `analyze`). Per delay: the jobs in which the slow rank was named, another
rank was named, or none; the other ranks' median wait a step and the median step, each the median
over the jobs. At delay 0 no rank was slowed, so any rank named is a false straggler; the line
under the table shows which ranks the rule named and how often each arrived last, so that a rank
late every time without a delay (four ranks on two cores are not symmetric) shows with its figures.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

WORLD = 4


def job(work: pathlib.Path, uri: str, delay: float, delay_ms: float, slow_rank: int, size: int, index: int,
        active: int, device_ms: float = 0.0) -> str:  # fmt: skip
    """Runs one torchrun job (`delay` of the step, `delay_ms`); returns its run id."""
    outbox = work / f"outbox-{index}"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               str(ROOT / "examples" / "ranks_straggler.py"), "--tracking-uri", uri, "--outbox", str(outbox),
               "--size", str(size), "--run-name", f"delay-{delay:g}-{index}", "--cycles", "2", "--active", str(active),
               "--flush-timeout-s", "120"]  # fmt: skip
    if delay:
        command += ["--slow-rank", str(slow_rank), "--delay-ms", f"{delay_ms:.3f}"]
    if device_ms:
        command += ["--device-ms", f"{device_ms:g}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=work)
    if done.returncode != 0:
        raise RuntimeError(f"job failed ({done.returncode}): {done.stderr[-3000:]}")
    found = re.search(r'"run_id": "([0-9a-f]{32})"', done.stdout)  # every rank prints it; lines may interleave
    if found is None:
        raise RuntimeError(f"job printed no run id: {done.stdout[-1000:]}")
    return found.group(1)


def judged(uri: str, run_id: str) -> dict:
    """What `ranks` finds in the run: the straggler, the others' wait, the step, who arrived last."""
    from mlflow_neuron._readback.ranks import read_ranks

    report = read_ranks(run_id, uri).report
    table = report.table
    straggler = (report.straggler or {}).get("rank")
    waits = table[table["rank"] != (straggler if straggler is not None else -1)]["wait_us"].dropna()
    return {"straggler": straggler, "sentence": report.sentence, "others_wait_us": float(waits.median()) if len(waits) else float("nan"),
            "step_us": float(table["step_us_median"].median()),
            "last": {int(r): p for r, p in zip(table["rank"], table["arrived_last_pct"]) if p is not None}}  # fmt: skip


def run_jobs(work: pathlib.Path, uri: str, args) -> dict[float, list[str]]:
    """Every job of every delay (delay 0 first: its median step sets the others' delays)."""
    runs, step_ms = {}, args.step_ms
    for delay in sorted(set(args.delays) | ({0.0} if step_ms is None else set())):
        runs[delay], started = [], time.perf_counter()
        for index in range(args.jobs if delay in args.delays else 1):
            try:
                runs[delay].append(job(work, uri, delay, delay * (step_ms or 0.0), args.slow_rank, args.size, index,
                                       args.steps // 2, args.device_ms))  # fmt: skip
            except RuntimeError as failed:  # a job that failed is said, not counted
                print(f"  delay {delay:.0%}, job {index}: {str(failed)[-300:]}", flush=True)
        if not delay:
            step_ms = statistics.median(judged(uri, r)["step_us"] for r in runs[0.0]) / 1000
            print(f"  the step without a delay: {step_ms:.2f} ms (median over {len(runs[0.0])} jobs)", flush=True)
        print(f"  delay {delay:.0%} ({delay * step_ms:.2f} ms): {len(runs[delay])} jobs in "
              f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return {d: r for d, r in runs.items() if d in args.delays}


def stored_runs(uri: str) -> dict[float, list[str]]:
    """The jobs' runs of an earlier store, by delay (from their names, `delay-<share>-<index>`)."""
    from mlflow.tracking import MlflowClient

    runs = {}
    for run in MlflowClient(uri).search_runs(["0"], filter_string="attributes.run_name LIKE 'delay-%'", max_results=5000):
        runs.setdefault(float(run.info.run_name.split("-")[1]), []).append(run.info.run_id)
    return dict(sorted(runs.items()))


def report(uri: str, runs: dict[float, list[str]], slow_rank: int, why: bool) -> None:
    """Judges every run as `ranks` would and prints the table."""
    rows, zero = [], []
    for delay, run_ids in runs.items():
        found = [judged(uri, run_id) for run_id in run_ids]
        named = Counter(f["straggler"] for f in found)
        right = named.get(slow_rank, 0) if delay else 0
        wrong = sum(n for rank, n in named.items() if rank is not None and (rank != slow_rank or not delay))
        rows.append((delay, len(found), right, wrong, named.get(None, 0),
                     statistics.median(f["others_wait_us"] for f in found) / 1000,
                     statistics.median(f["step_us"] for f in found) / 1000))  # fmt: skip
        zero = found if not delay else zero
        for f in found if why else []:
            if f["straggler"] != (slow_rank if delay else None):
                print(f"  delay {delay:.0%}: {f['sentence']}", flush=True)
    print(f"\n| delay (of the undelayed step) | jobs | right rank named | another rank named | none named | "
          f"others' wait a step (ms) | step (ms) |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for delay, n, right, wrong, none, wait, step in rows:
        print(f"| {delay:.0%} | {n} | {right if delay else '-'} | {wrong} | {none} | {wait:.2f} | {step:.2f} |")
    if zero:
        named = Counter(f["straggler"] for f in zero if f["straggler"] is not None)
        last = {r: statistics.median(f["last"].get(r, 0.0) for f in zero) for r in range(WORLD)}
        print(f"\nno delay: ranks named {dict(named) or 'none'}; each rank arrived last at (median over the jobs) "
              + ", ".join(f"rank {r} {p:.0f}%" for r, p in last.items())
              + " of the collectives that kept others waiting")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20, help="jobs per delay (default: %(default)s)")
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.3],
                        help="the slow rank's delay, a share of the step (default: %(default)s)")
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--size", type=int, default=1536, help="the matmul's side (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps a job, in 2 cycles (default: %(default)s)")
    parser.add_argument("--device-ms", type=float, default=0.0,
                        help="each step also waits this long on every rank, standing for an accelerator's time "
                             "(the host free meanwhile, as on Trainium or a GPU); default: %(default)s, a CPU-bound step")
    parser.add_argument("--why", action="store_true", help="print the sentence of each job whose verdict was wrong")
    parser.add_argument("--keep", metavar="DIR", help="keep the jobs' store (and outboxes) in DIR, to judge again")
    parser.add_argument("--step-ms", type=float, help="the undelayed step, measured before (no delay-0 job is then run "
                        "unless --delays has 0)")
    parser.add_argument("--rejudge", metavar="DIR", help="run no job: judge again the runs kept in DIR by --keep")
    args = parser.parse_args()
    if args.rejudge:
        uri = f"sqlite:///{pathlib.Path(args.rejudge).resolve() / 'mlflow.db'}"
        print(f"the runs kept in {args.rejudge}, judged again", flush=True)
        report(uri, stored_runs(uri), args.slow_rank, args.why)
        return
    print(f"{WORLD}-rank torchrun jobs (gloo, CPU), {args.jobs} a delay, {args.steps} steps a job, slow rank "
          f"{args.slow_rank}, matmul {args.size}, device wait {args.device_ms:g} ms; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the "
          "start", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rank-calibration-") as tmp:
        work = pathlib.Path(args.keep or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{work / 'mlflow.db'}"
        runs = run_jobs(work, uri, args)
        print(f"load average {os.getloadavg()[0]:.1f} at the end of the jobs; the machine was shared with other work")
        report(uri, runs, args.slow_rank, args.why)


if __name__ == "__main__":
    main()
