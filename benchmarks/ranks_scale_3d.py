"""`mlflow-neuron ingest` of a folder of 3D-parallel rank traces, then `mlflow-neuron ranks` on the
run, at 64, 1,024 and 4,096 ranks, through a real `mlflow server`: seconds, peak memory, requests.

    python benchmarks/ranks_scale_3d.py [--ranks 64 1024 4096] [--repeats 2] [--traces DIR]

About 3 minutes on 2 quiet cores, and 40 s more the first time, to make the traces (1.9 GB at
4,096 ranks). Figures: docs/figures.md, "Ranks at scale".

Each job is made by the trace generator (`tests/rank3d.py`: NCCL-format Kineto traces, one file a
rank, 6 profiled steps, TP 8 x PP 4 x DP (ranks / 32), TP 4 x PP 2 x DP 8 at 64 ranks; 32 ranks a
host, host clocks up to 5 ms apart, one rank 15 ms slow before each of its TP all_reduces), once:
with `--traces DIR` the folders are kept there and reused by later runs (making them is timed
apart and not counted). Then, against `mlflow server` on 127.0.0.1 (sqlite behind it, artifacts
served by it: `tests/servers.py`), each as a user runs it, a fresh process with its imports:

    mlflow-neuron ingest DIR --experiment ranks-scale-3d --run-name N-ranks --tracking-uri http://127.0.0.1:P
    mlflow-neuron ranks RUN --tracking-uri http://127.0.0.1:P --format json

For each: wall seconds; peak RSS of the largest process (the kernel's count at exit, `wait4`) and
of the command's processes together (sampled every 0.1 s: a pool's workers included); the HTTP
requests the server answered (its access log). `ranks` must name the planted rank; the table says
which rank it named. The machine is whatever it is at the time: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import psutil  # noqa: E402
from rank3d import Job3D, generate  # noqa: E402
from servers import MlflowServer  # noqa: E402

SHAPES = {64: (4, 2, 8, 37)}  # ranks -> (tp, pp, dp, slow rank); others: TP 8 x PP 4 x DP ranks/32
REQUEST = re.compile(rb'"(GET|POST|PUT|PATCH|DELETE|HEAD) (?!/health)')


def job_of(ranks: int) -> Job3D:
    tp, pp, dp, slow = SHAPES.get(ranks) or (8, 4, ranks // 32, ranks // 2 + 45)
    if tp * pp * dp != ranks:
        raise SystemExit(f"{ranks} ranks: give 64 or a multiple of 32")
    return Job3D(tp=tp, pp=pp, dp=dp, steps=6, slow_rank=slow, clock_skew_ms=5.0, ranks_per_node=32)


def traces(ranks: int, root: pathlib.Path) -> tuple[pathlib.Path, int, float | None]:
    """(the job's folder, its planted slow rank, seconds it took to make; None: made before)."""
    folder, job = root / f"job-{ranks}", job_of(ranks)
    if (folder / "truth.json").exists():
        return folder, json.loads((folder / "truth.json").read_text())["straggler"]["rank"], None
    started = time.perf_counter()
    truth = generate(job, folder)
    return folder, truth["straggler"]["rank"], time.perf_counter() - started


class Measured:
    """A command run to its end: seconds, peak RSS (largest process; all its processes), output."""

    def __init__(self, command: list[str], out: pathlib.Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
        self.tree_peak, self._done = 0, threading.Event()
        with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
            started = time.perf_counter()
            process = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr)
            sampler = threading.Thread(target=self._sample, args=(process.pid,), daemon=True)
            sampler.start()
            _, status, usage = os.wait4(process.pid, 0)
            self.seconds = time.perf_counter() - started
            process.returncode = os.waitstatus_to_exitcode(status)
        self._done.set()
        sampler.join()
        self.largest = usage.ru_maxrss * 1024  # the process itself, or a child it waited for if larger
        self.text = out.read_text()
        if process.returncode != 0:
            raise SystemExit(f"{command[3]} failed ({process.returncode}): {out.with_suffix('.err').read_text()[-3000:]}")

    def _sample(self, pid: int) -> None:
        try:
            top = psutil.Process(pid)
            while not self._done.wait(0.1):
                total = 0
                for process in [top, *top.children(recursive=True)]:
                    try:
                        total += process.memory_info().rss
                    except psutil.Error:
                        pass
                self.tree_peak = max(self.tree_peak, total)
        except psutil.Error:
            return


def requests(server: MlflowServer) -> int:
    time.sleep(0.3)  # the access log line of the last answer
    return len(REQUEST.findall(server.log_path.read_bytes()))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlflow_neuron.cli", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=2, help="`ranks` runs per job (default: %(default)s)")
    parser.add_argument("--traces", type=pathlib.Path, help="where the generated jobs are kept and reused")
    args = parser.parse_args()
    mb = 1024**2
    with tempfile.TemporaryDirectory(prefix="ranks-scale-3d-") as tmp:
        root = args.traces or pathlib.Path(tmp, "traces")
        with MlflowServer(pathlib.Path(tmp, "server")) as server:
            print(f"mlflow server {server.uri} (sqlite, served artifacts); load average at the start "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
            print(f"{'ranks':>5} {'ingest s':>9} {'peak MB':>12} {'requests':>8} | {'ranks s':>7} {'peak MB':>7} "
                  f"{'requests':>8}  straggler (planted)  load", flush=True)  # fmt: skip
            for size in args.ranks:
                folder, planted, made = traces(size, root)
                if made is not None:
                    print(f"(made the {size}-rank job's traces in {made:.1f} s, not counted)", flush=True)
                before = requests(server)
                ingest = Measured(cli("ingest", str(folder), "--experiment", "ranks-scale-3d", "--run-name",
                                      f"{size}-ranks", "--tracking-uri", server.uri), pathlib.Path(tmp, "ingest.out"))  # fmt: skip
                ingest_requests, run_id = requests(server) - before, ingest.text.rsplit("into run ", 1)[1].split()[0]
                for repeat in range(args.repeats):
                    before = requests(server)
                    read = Measured(cli("ranks", run_id, "--tracking-uri", server.uri, "--format", "json"),
                                    pathlib.Path(tmp, "ranks.out"))  # fmt: skip
                    report = json.loads(read.text)
                    named = report["straggler"]["rank"] if report["straggler"] else None
                    first = (f"{ingest.seconds:>9.1f} {ingest.largest / mb:>5,.0f}/{ingest.tree_peak / mb:>6,.0f} "
                             f"{ingest_requests:>8}") if repeat == 0 else " " * 36  # fmt: skip
                    print(f"{size:>5} {first} | {read.seconds:>7.2f} {read.largest / mb:>7,.0f} "
                          f"{requests(server) - before:>8}  {named} ({planted}){'' if named == planted else ' WRONG'}"
                          f"  {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    print("peak MB: the largest process / all the command's processes together (ranks: one process); "
          "requests: those the server answered; load: the 1-minute load average after the command.")


if __name__ == "__main__":
    main()
