"""`mlflow-neuron history` over long nightly series, through a real `mlflow server`: seconds, and the
cost of each extra run.

    python benchmarks/history_scale.py [--runs 50 200 1000] [--no-slow] [--compare 50]

Starts `mlflow server` on 127.0.0.1 (sqlite behind it, artifacts served by it). One run is profiled
through `MLflowProfilerCallback` on the fake device (two cycles of 10 steps, a `record_function`
region); each series is that run cloned N times (`tests/nightly_series.py`: every metric point and
file it logged, times scaled, a seeded ±10% jitter per step, 2% stalls), +30% from run 0.6 N on,
one run a night with its own commit. Each series is written into the server's store before the
server starts. Then, per N, the command a user runs (a fresh process: imports included) is timed:

    mlflow-neuron history --tracking-uri http://127.0.0.1:P --experiment nightly-N --format json

and the change it finds is checked against the true one (commit c<0.6 N>). `--tables` (every run's
tables: the path taken before summary metrics, and by runs logged before them) is timed at the
smallest N beside it, and `compare --experiment` of 50 variants (run names v00..v49, v25 on
slower) with `--baseline v00`: as it reads many runs (summary metrics first, tables only for the runs
shown in detail) and with `--tables` (every run's tables, every run in detail: the path before; left out
with `--no-slow`). Prints seconds, the cost per extra run over the smallest N, and where the
change was found.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import fake_device  # noqa: E402
from nightly_series import Cloner, make_template  # noqa: E402
from servers import MlflowServer  # noqa: E402


def history(uri: str, experiment: str, *extra: str) -> tuple[float, dict]:
    return command("history", "--tracking-uri", uri, "--experiment", experiment, "--format", "json", *extra)


def command(*args: str) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "mlflow_neuron.cli", *args]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def compare(uri: str, experiment: str, *extra: str) -> None:
    """Times `compare --experiment` of the variants and prints what it read and found."""
    seconds, report = command("compare", "--tracking-uri", uri, "--experiment", experiment, "--baseline", "v00",
                              "--format", "json", *extra)  # fmt: skip
    slower = sorted(run for run, v in report["verdicts"].items() if v == "slower")
    many = report.get("many")
    runs = len(many["rows"]) if many else len(report["runs"])
    read = many["tables_read"] if many else runs
    print(f"compare --experiment {experiment} {' '.join(extra) or '(summaries first)'}: {seconds:.1f} s, {runs} runs, "
          f"{len(report['runs'])} in detail, tables of {read} read; slower in detail: {len(slower)} "
          f"({', '.join(slower[:3])}{' ...' if len(slower) > 3 else ''})"
          + (f"; {len(many['differing'])} differ by their summaries" if many else ""), flush=True)  # fmt: skip


def found(report: dict) -> str:
    return ", ".join(f"{c['before_commit']}->{c['after_commit']} {c['verdict']} x{c['ratio']:.2f}"
                     for c in report["changes"]) or "none"  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, nargs="+", default=[50, 200, 1000], help="series lengths (default: %(default)s)")
    parser.add_argument("--no-slow", action="store_true", help="skip timing --tables (history at the smallest N, and compare)")
    parser.add_argument("--compare", type=int, default=50, metavar="N",
                        help="also time `compare --experiment` of N variants (0: not; default: %(default)s)")
    args = parser.parse_args()
    sizes = sorted(args.runs)
    with tempfile.TemporaryDirectory(prefix="history-scale-") as tmp:
        work = pathlib.Path(tmp)
        started = time.perf_counter()
        template = make_template(work / "template", fake_device.build(work / "fake_device"))
        server = MlflowServer(work / "server")
        cloner = Cloner(template, server.backend_store_uri, server.artifacts_dir, "mlflow-artifacts:")
        for n in sizes:
            cloner.make(f"nightly-{n}", n, slower_from=int(0.6 * n), seed=n)
        if args.compare:
            cloner.make(f"variants-{args.compare}", args.compare, run_name="v{i:02d}", slower_from=args.compare // 2)
        print(f"made {sum(sizes) + args.compare} runs in {time.perf_counter() - started:.0f} s", flush=True)
        with server.start():
            print(f"{'runs':>6} {'history (s)':>12} {'per extra run (ms)':>19} {'tables read':>12}  change found (true: "
                  "c<0.6 N - 1>->c<0.6 N>)")  # fmt: skip
            base = None
            for n in sizes:
                seconds, report = history(server.uri, f"nightly-{n}")
                extra = "" if base is None else f"{(seconds - base[1]) / (n - base[0]) * 1000:.1f}"
                base = base or (n, seconds)
                truth = f"c{int(0.6 * n) - 1:04d}->c{int(0.6 * n):04d}"
                print(f"{n:>6} {seconds:>12.1f} {extra:>19} {report['tables_read']:>12}  {found(report)}"
                      f"{'' if truth in found(report) else '  (MISSED ' + truth + ')'}", flush=True)  # fmt: skip
            if args.compare:
                for extra in ([] if args.no_slow else [["--tables"]]) + [[]]:
                    compare(server.uri, f"variants-{args.compare}", *extra)
            if not args.no_slow:
                seconds, report = history(server.uri, f"nightly-{sizes[0]}", "--tables")
                print(f"{sizes[0]:>6} {seconds:>12.1f} {seconds / sizes[0] * 1000:>18.0f}* {report['tables_read']:>12}  "
                      f"{found(report)}   --tables (* seconds / runs)")  # fmt: skip


if __name__ == "__main__":
    main()
