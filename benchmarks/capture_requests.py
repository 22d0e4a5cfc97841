"""What `callback.schedule()` asks of the tracking server while nothing happens, and how soon a
request through MLflow gives data: a `torchrun` job of `examples/profile_when_it_matters.py` (20 ms
steps, gloo, one node) through a counting proxy in front of a real `mlflow server` on 127.0.0.1.

    python benchmarks/capture_requests.py [--ranks 2] [--idle-s 60] [--requests 3] [--steps 6]

- **idle**: the requests of the node (its helper and every rank) in `--idle-s` seconds after the
  baseline's cycle was delivered, per minute. Counted by `tests/http_faults.FaultProxy` (each
  request seen once).
- **on request**: `mlflow-neuron capture RUN --steps N` (a process of its own, as a user runs it),
  then the time from its return until the cycle is readable (its reason tag on the run, read
  directly from the server every 0.1 s), and the same less the N + 1 steps the capture takes (20
  ms each, from the job's own step times); `--requests` times in a row, a few seconds apart.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from http_faults import FaultProxy  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from servers import MlflowServer, free_port  # noqa: E402

from mlflow_neuron._record.model import capture_reasons  # noqa: E402

EXAMPLE = ROOT / "examples" / "profile_when_it_matters.py"
STEP_MS = 20.0


def kind(method: str, path: str) -> str:
    return f"{method} {re.sub(r'/[0-9a-f]{32}/', '/<id>/', path.split('?')[0])}"


def reasons(client: MlflowClient, run_id: str) -> dict[int, str]:
    return capture_reasons(client.get_run(run_id).data.tags)


def wait_for(what, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"gave up after {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="capture-requests-") as tmp:
        with MlflowServer(pathlib.Path(tmp) / "server") as server, FaultProxy(server.port, lambda *_: None) as proxy:
            client = MlflowClient(server.uri)
            run_id = client.create_run("0").info.run_id
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MLFLOW_RUN_ID": run_id}
            steps = int((args.idle_s + 30 + args.requests * 25) * 1000 / STEP_MS)
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
                       "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE),
                       "--tracking-uri", proxy.uri, "--steps", str(steps), "--step-ms", str(STEP_MS)]  # fmt: skip
            job = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                wait_for(lambda: reasons(client, run_id), 180)  # the baseline's cycle is in
                time.sleep(2)
                start, before = time.monotonic(), len(proxy.seen)
                time.sleep(args.idle_s)
                idle = proxy.seen[before:]
                minutes = (time.monotonic() - start) / 60
                print(f"idle, {args.ranks} rank(s) on one node: {len(idle)} requests in {minutes * 60:.0f} s = "
                      f"{len(idle) / minutes:.1f} a minute", flush=True)  # fmt: skip
                for name, count in sorted(Counter(kind(m, p) for _, m, p, _ in idle).items()):
                    print(f"    {count:3d} {name}")
                for _ in range(args.requests):
                    known = set(reasons(client, run_id))
                    done = subprocess.run([sys.executable, "-m", "mlflow_neuron.cli", "capture", run_id, "--steps",
                                           str(args.steps), "--tracking-uri", server.uri], capture_output=True,
                                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
                    asked = time.monotonic()
                    if done.returncode:
                        raise SystemExit(done.stderr)
                    new = wait_for(lambda: {s: r for s, r in reasons(client, run_id).items()
                                            if s not in known and r.startswith("requested")}, 120)  # fmt: skip
                    took = time.monotonic() - asked
                    capture_s = (args.steps + 1) * STEP_MS / 1000
                    print(f"on request: cycle {sorted(new)} readable {took:.2f} s after `capture` returned; "
                          f"less its {args.steps + 1} steps: {took - capture_s:.2f} s", flush=True)  # fmt: skip
                    time.sleep(3)
            finally:
                job.terminate()
                job.wait(60)
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
