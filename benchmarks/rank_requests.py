"""What more local ranks cost the tracking server: a 1-rank and a 4-rank `torchrun` job of
`examples/ranks_straggler.py` (gloo, CPU, 2 cycles of 4 steps), each through a counting proxy in
front of a real `mlflow server` on 127.0.0.1.

    python benchmarks/rank_requests.py [--repeats 3] [--ranks 1 4] [--show]

Requests are counted by `tests/http_faults.FaultProxy` (the proxy asks the server to close each
connection after its answer, so each request is seen once). Two ways of giving the job its run:

- **created**: the job creates its run, as the example does by default (a 1-rank job is not a
  distributed one: its drain creates the run when it first sends; a 4-rank job's rank 0 creates it
  in the callback's constructor), and ends it;
- **given**: the run is made beforehand and passed as `MLFLOW_RUN_ID`: neither job creates nor
  ends one, so the counts are the cycles' alone (`tests/test_rank_node_files.py` measures this way).

Prints one line per job: the ranks, the way, the requests; `--show` adds them by method and path.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from http_faults import FaultProxy  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from servers import MlflowServer, free_port  # noqa: E402

EXAMPLE = ROOT / "examples" / "ranks_straggler.py"


def job(uri: str, ranks: int, cwd: pathlib.Path, run_id: str | None) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_RUN_ID", None)
    if run_id:
        env["MLFLOW_RUN_ID"] = run_id
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE), "--tracking-uri", uri,
               "--experiment-id", "0", "--flush-timeout-s", "120"]  # fmt: skip
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-4000:])


def kind(method: str, path: str) -> str:
    path = re.sub(r"/[0-9a-f]{32}/|/tr-[0-9a-f]{32}/", "/<id>/", path.split("?")[0])
    return f"{method} {path.rsplit('/', 1)[0] if '/artifacts/' in path else path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--show", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rank-requests-") as tmp:
        with MlflowServer(pathlib.Path(tmp) / "server") as server, FaultProxy(server.port, lambda *_: None) as proxy:
            for repeat in range(args.repeats):
                for way in ("created", "given"):
                    for ranks in args.ranks:
                        run_id = MlflowClient(server.uri).create_run("0").info.run_id if way == "given" else None
                        cwd = pathlib.Path(tmp) / f"{way}-{ranks}-{repeat}"
                        cwd.mkdir()
                        before = len(proxy.seen)
                        job(proxy.uri, ranks, cwd, run_id)
                        seen = proxy.seen[before:]
                        print(f"{ranks} rank(s), run {way}: {len(seen)} requests", flush=True)
                        if args.show:
                            for name, count in sorted(Counter(kind(m, p) for _, m, p, _ in seen).items()):
                                print(f"    {count:3d} {name}")


if __name__ == "__main__":
    main()
