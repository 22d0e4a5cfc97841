"""What starting costs: importing the callback, and the helper process from start to ready.

    python benchmarks/startup.py [--repeats 5] [--against OTHER_CHECKOUT]

Each measurement runs in fresh processes, median of `--repeats`:

- `from mlflow_neuron import MLflowProfilerCallback`: wall time in a fresh interpreter, and with
  torch and mlflow imported first (as in a training script); which heavy packages and which of
  the package's layers it loaded (matplotlib and the comparison code must not be);
- the helper process: `callback.start_helper()` from the call to the helper's "ready" (it has
  loaded what it reads and delivers with, and takes cycles from then on), its RSS once ready, and
  whether libtorch is mapped into it.

With `--against`, the same runs also take the package from another checkout (for example the
version before a change), interleaved with this one, and the ratios are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

IMPORT_PROBE = """
import json, sys, time
if "--after-torch-and-mlflow" in sys.argv:  # what a training script, which has both, pays
    import mlflow, torch
started = time.perf_counter()
from mlflow_neuron import MLflowProfilerCallback
elapsed = time.perf_counter() - started
heavy = sorted(m for m in ("torch", "mlflow", "pandas", "numpy", "matplotlib", "orjson") if m in sys.modules)
ours = sorted({m.split(".")[1] for m in sys.modules if m.startswith("mlflow_neuron.")})
print(json.dumps({"seconds": elapsed, "heavy": heavy, "ours": ours}))
"""

HELPER_PROBE = """
import json, sys, time
import mlflow
from mlflow_neuron import MLflowProfilerCallback
uri = "sqlite:///" + sys.argv[1]
run_id = mlflow.MlflowClient(uri).create_run("0").info.run_id
callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, outbox=sys.argv[2])
started = time.perf_counter()
ready = callback.start_helper(300)
elapsed = time.perf_counter() - started
pid = callback._producer.helper.helper_pid
status = open(f"/proc/{pid}/status").read()
rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
maps = open(f"/proc/{pid}/maps").read()
callback.close()
print(json.dumps({"ready": ready, "seconds": elapsed, "rss_kb": rss_kb, "libtorch": "libtorch" in maps}))
"""


def probe(code: str, root: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600,
                         cwd=tempfile.mkdtemp(prefix="mlflow-neuron-startup-"))  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"probe failed in {root}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout of this project, measured alike")
    args = parser.parse_args(argv)
    roots = {"this": ROOT, **({"other": args.against.resolve()} if args.against else {})}
    imports: dict[str, list[dict]] = {name: [] for name in roots}
    warm: dict[str, list[dict]] = {name: [] for name in roots}
    helpers: dict[str, list[dict]] = {name: [] for name in roots}
    work = Path(tempfile.mkdtemp(prefix="mlflow-neuron-startup-"))
    for i in range(args.repeats):  # interleaved: a noisy moment hits both checkouts alike
        for name, root in roots.items():
            imports[name].append(probe(IMPORT_PROBE, root))
            warm[name].append(probe(IMPORT_PROBE, root, "--after-torch-and-mlflow"))
            helpers[name].append(probe(HELPER_PROBE, root, str(work / f"{name}-{i}.db"), str(work / f"outbox-{name}")))
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs; median of {args.repeats} fresh processes")
    for name, root in roots.items():
        first = imports[name][0]
        helper_ok = all(h["ready"] for h in helpers[name])
        print(f"\n{name}: {root}")
        print(f"  import MLflowProfilerCallback  {statistics.median(r['seconds'] for r in imports[name]):6.2f} s   "
              f"loads {', '.join(first['heavy'])}; package parts: {', '.join(first['ours'])}")  # fmt: skip
        print(f"  ... with torch and mlflow imported first {statistics.median(r['seconds'] for r in warm[name]):6.2f} s")
        print(f"  helper start to ready          {statistics.median(h['seconds'] for h in helpers[name]):6.2f} s   "
              f"RSS when ready {statistics.median(h['rss_kb'] for h in helpers[name]) / 1024:.0f} MiB, "
              f"libtorch mapped: {any(h['libtorch'] for h in helpers[name])}"
              + ("" if helper_ok else "; NOT READY in some runs"))  # fmt: skip
    if "other" in roots:
        for what, runs, key in (("import", imports, "seconds"), ("import after torch", warm, "seconds"),
                                ("helper ready", helpers, "seconds"), ("helper RSS", helpers, "rss_kb")):  # fmt: skip
            ratios = [a[key] / b[key] for a, b in zip(runs["this"], runs["other"])]
            print(f"{what:>14}: this / other = {statistics.median(ratios):.2f} (each repeat {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
