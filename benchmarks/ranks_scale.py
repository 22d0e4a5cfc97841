"""`mlflow-neuron ranks` on a 64-rank run through a real `mlflow server`: seconds, and what each rank
costs MLflow per cycle.

    python benchmarks/ranks_scale.py [--ranks 64] [--cycles 1 4] [--steps 10]

Starts `mlflow server` on 127.0.0.1 (sqlite behind it, artifacts served by it) with a counting
proxy in front (tests/servers.py `DelayProxy`, no delay: it counts the HTTP requests it sees). The
rank summaries are simulated from chosen shapes (`tests/rank_shapes.py`: each step 70 ms of compute,
then an all_reduce; rank 17 computes 20 ms longer; eight ranks a host; per-rank jitter), in the
exact format each rank logs. Per cycle count C:

- **write**: each rank's summary of each cycle is sent the way a rank sends it, through
  `RunLogger.deliver` of a `Delivery` that holds only that file at its place (the drain's path for a
  rank that logs no metrics of its own): requests and bytes (the file) per rank per cycle.
- **read**: the command a user runs (a fresh process: imports included) is timed, and its requests
  counted:

      mlflow-neuron ranks RUN --tracking-uri http://127.0.0.1:P --format json

  beside its imports alone (a fresh process importing what it imports), the read and analysis in
  process (imports done), and reading the same files one by one through `MlflowClient` (a listing
  per rank, then `download_artifacts` of each file), the way one might without downloading the
  folder at once.
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
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlflow.tracking import MlflowClient  # noqa: E402
from rank_shapes import Job, cycles  # noqa: E402
from servers import DelayProxy, MlflowServer  # noqa: E402

from mlflow_neuron._delivery.mlflow_io import RunLogger  # noqa: E402
from mlflow_neuron._record.model import Delivery, RunRef  # noqa: E402


def write(uri: str, proxy: DelayProxy, run_id: str, logged: list[list[dict]]) -> tuple[float, float]:
    """Sends every rank's summaries as each rank would; returns (requests, bytes) per rank per cycle."""
    requests, size, count = proxy.requests, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for summaries in logged:
            for summary in summaries:
                staged = pathlib.Path(tmp, f"r{summary['rank']}c{summary['cycle_step']}")
                staged.mkdir()
                text = json.dumps(summary, separators=(",", ":"))
                (staged / "rank_summary.json").write_text(text, encoding="utf-8")
                place = f"profiler/ranks/rank_{summary['rank']}/cycle_{summary['cycle_step']}.json"
                delivery = Delivery(step=summary["cycle_step"], timestamp_ms=int(time.time() * 1000),
                                    artifact_dir=f"profiler/step_{summary['cycle_step']}", files_dir=str(staged),
                                    placed=(("rank_summary.json", place),))  # fmt: skip
                RunLogger(RunRef(uri, run_id)).deliver(delivery)
                size, count = size + len(text.encode()), count + 1
    return (proxy.requests - requests) / count, size / count


def imports() -> float:
    """Seconds a fresh process takes to import what `ranks` imports (MLflow, pandas), for scale."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mlflow_neuron.cli, mlflow.tracking, pandas, mlflow_neuron._analysis.ranks.analysis"],
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=600)  # fmt: skip
    return time.perf_counter() - started


def ranks_command(uri: str, run_id: str) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mlflow_neuron.cli", "ranks", run_id, "--tracking-uri", uri,
                           "--format", "json"], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"ranks failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def in_process(uri: str, run_id: str) -> float:
    """Seconds `ranks` spends reading and analysing, its imports done (this process)."""
    from mlflow_neuron._readback.ranks import read_ranks

    started = time.perf_counter()
    read_ranks(run_id, uri).report_json
    return time.perf_counter() - started


def one_by_one(uri: str, run_id: str) -> float:
    """Seconds to read the same files through MlflowClient, file by file."""
    client = MlflowClient(uri)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for folder in client.list_artifacts(run_id, "profiler/ranks"):
            for item in client.list_artifacts(run_id, folder.path):
                json.loads(pathlib.Path(client.download_artifacts(run_id, item.path, tmp)).read_text())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64, help="world size (default: %(default)s)")
    parser.add_argument("--cycles", type=int, nargs="+", default=[1, 4], help="cycles per run (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="profiled steps per cycle (default: %(default)s)")
    args = parser.parse_args()
    job = Job(world_size=args.ranks, slow_rank=min(17, args.ranks - 1), delay_us=20_000)
    with tempfile.TemporaryDirectory(prefix="ranks-scale-") as tmp:
        server = MlflowServer(pathlib.Path(tmp, "server"))
        with server, DelayProxy(server.port, delay_s=0.0) as proxy:
            client = MlflowClient(proxy.uri)
            print(f"{args.ranks} ranks, {args.steps} steps a cycle, through mlflow server (sqlite, served artifacts); "
                  f"the machine was shared with other work: read the columns side by side", flush=True)  # fmt: skip
            print(f"{'cycles':>6} {'write: requests':>15} {'bytes':>8} {'ranks (s)':>10} {'imports (s)':>12} "
                  f"{'read (s)':>9} {'requests':>9} {'file by file (s)':>17}  straggler found (true: rank {job.slow_rank})")  # fmt: skip
            for count in args.cycles:
                run_id = client.create_run("0", run_name=f"ranks-{args.ranks}x{count}").info.run_id
                logged = cycles(job, count=count, steps_per_cycle=args.steps)
                requests, size = write(proxy.uri, proxy, run_id, logged)
                before = proxy.requests
                seconds, report = ranks_command(proxy.uri, run_id)
                read_requests = proxy.requests - before
                slow = one_by_one(proxy.uri, run_id)
                found = report["straggler"]["rank"] if report["straggler"] else "none"
                print(f"{count:>6} {requests:>15.1f} {size:>8,.0f} {seconds:>10.2f} {imports():>12.2f} "
                      f"{in_process(proxy.uri, run_id):>9.2f} {read_requests:>9} "
                      f"{slow:>17.2f}  "
                      f"rank {found}; {len(report['ranks'])} ranks read", flush=True)  # fmt: skip
    print("write: per rank per cycle (requests through the proxy; bytes: the summary file). ranks: the command in a "
          "fresh process, imports included (imports: a fresh process importing what it imports, for scale; read: "
          "the same read and analysis in this process, its imports done); "
          "requests: its HTTP requests; file by file: the same files read one at a time through MlflowClient.")


if __name__ == "__main__":
    main()
