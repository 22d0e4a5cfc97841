"""What continuous profiling costs a training loop, whole: the loop's wall time with each exporter.

    python benchmarks/loop_cost.py [--repeats 3] [--sizes 3000:70,30000:21] [--rss-ops 100000]

The loop is `x.add_(y)` N times a step, profiled with schedule(wait=5, warmup=1, active=1,
repeat=0): one cycle every 7 steps. In one run it times, median of `--repeats`:

- no profiler; the profiler with a no-op handler; `export_chrome_trace` per cycle;
  `tensorboard_trace_handler`;
- MLflowProfilerCallback in-process (`process="inline"`) and with the helper process
  (`process="helper"`), each against a local sqlite store and a real `mlflow server` (127.0.0.1).

"loop" is the wall time of the steps, "drain" the profiler's exit (the callback waits there for the
cycles still pending); "vs tensorboard" compares median loops, "repeats" the lowest and highest
ratio of one repeat's loop to tensorboard's in the same round, "with drain" loop + drain. The callback's helper is started and warmed before the loop (its one-time
start-up is printed apart): the loop then shows the steady state of a long training run.
"in-flight" compares the median step while a cycle is being processed (handed off, not yet
delivered) with the median step with none; the steps that end a cycle (the trace save) are
counted in neither. Last, the peak RSS of the training process and of the helper for one
`--rss-ops`-op cycle, each path in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import mlflow  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler  # noqa: E402

from mlflow_neuron import MLflowProfilerCallback  # noqa: E402

SCHEDULE = dict(wait=5, warmup=1, active=1, repeat=0)


class Counting:
    """Wraps a handler; counts cycles so steps that end one are known."""

    def __init__(self, handler):
        self.handler, self.cycles = handler, 0

    def __call__(self, prof):
        self.cycles += 1
        if self.handler is not None:
            self.handler(prof)


def run_loop(ops: int, steps: int, handler=None, callback=None) -> dict:
    """One profiled (or, with handler None and callback None, unprofiled) loop."""
    torch.manual_seed(0)
    x, y = torch.zeros(64), torch.ones(64)
    counting = Counting(handler) if handler is not None else None
    times, kinds = [], []

    def settled() -> int:
        return callback.cycles_logged + len(callback.outbox_records)

    def body():
        for _ in range(ops):
            x.add_(y)

    if counting is None:
        start = time.perf_counter()
        for _ in range(steps):
            s = time.perf_counter()
            body()
            times.append(time.perf_counter() - s)
            kinds.append("idle")
        return {"loop": time.perf_counter() - start, "drain": 0.0, "times": times, "kinds": kinds}
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(**SCHEDULE), on_trace_ready=counting) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            s = time.perf_counter()
            before = counting.cycles
            busy = callback is not None and settled() < callback.cycles_read
            body()
            prof.step()
            times.append(time.perf_counter() - s)
            kinds.append("cycle" if counting.cycles != before else "in_flight" if busy else "idle")
        loop = time.perf_counter() - start
        drain_start = time.perf_counter()
    return {"loop": loop, "drain": time.perf_counter() - drain_start, "times": times, "kinds": kinds}


def callback_loop(ops, steps, uri, process, work) -> dict:
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run("0").info.run_id
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, process=process, outbox=work / "outbox",
                                      flush_timeout_s=300)  # fmt: skip
    startup = 0.0
    if process == "helper":
        t = time.perf_counter()
        if not callback.start_helper(300):
            raise RuntimeError("the helper did not start")
        startup = time.perf_counter() - t
    result = run_loop(ops, steps, callback, callback)
    callback.close()
    if callback.cycles_logged != result["kinds"].count("cycle"):
        raise RuntimeError(f"{callback.cycles_logged} cycles logged, {result['kinds'].count('cycle')} profiled")
    result["startup"] = startup
    result["spilled"] = callback.reporter.counts.get("stored_in_outbox", 0)
    result["parser"] = getattr(callback._sender, "parser", None)
    result["jobs"] = getattr(callback._sender, "jobs_sent", 0)
    return result


def in_flight_ratio(results: list[dict]) -> float | None:
    busy = [t for r in results for t, k in zip(r["times"], r["kinds"]) if k == "in_flight"]
    idle = [t for r in results for t, k in zip(r["times"], r["kinds"]) if k == "idle"]
    if not busy or not idle:
        return None
    return statistics.median(busy) / statistics.median(idle)


def rss_child(path: str, ops: int, work: Path) -> None:
    """One `ops`-op cycle in this (fresh) process; prints the peak RSS of it and of the helper.

    The helper's peak is its VmHWM, read while it is still up (after the cycle is delivered):
    its own `getrusage` maxrss would also count this process's RSS when it forked the helper."""
    uri = f"sqlite:///{work / 'rss.db'}"
    handler, callback = None, None
    if path == "tensorboard":
        handler = tensorboard_trace_handler(str(work / "tb-rss"))
    else:
        run_id = mlflow.MlflowClient(uri).create_run("0").info.run_id
        callback = handler = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, process=path,
                                                    outbox=work / "outbox-rss", flush_timeout_s=300)  # fmt: skip
        if path == "helper":
            callback.start_helper(300)
    x, y = torch.zeros(64), torch.ones(64)
    helper_kb = None
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
                 on_trace_ready=handler) as prof:  # fmt: skip
        for step in range(4):
            for _ in range(ops):
                x.add_(y)
            prof.step()
            if step == 2 and callback is not None:  # the cycle ended at this step
                callback.flush(300)
                helper_kb = _vm_hwm_kb(getattr(callback._sender, "helper_pid", None))
    if callback is not None:
        callback.close()
    print(json.dumps({"training_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "helper_kb": helper_kb}))


def _vm_hwm_kb(pid: int | None) -> int | None:
    if pid is None:
        return None
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="3000:70,30000:21", help="ops per step : steps, comma-separated")
    parser.add_argument("--rss-ops", type=int, default=100_000)
    parser.add_argument("--no-server", action="store_true", help="sqlite only")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, args.rss_ops, Path(args.work))
        return
    import warnings

    from mlflow_neuron import MLflowNeuronWarning

    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    warnings.filterwarnings("ignore", category=MLflowNeuronWarning)  # counted in the notes instead
    from servers import MlflowServer

    work = Path(tempfile.mkdtemp(prefix="mlflow-neuron-loop-"))
    print(f"torch {torch.__version__}, mlflow {mlflow.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; median of {args.repeats}")  # fmt: skip
    server = None
    stores = {"sqlite": f"sqlite:///{work / 'mlflow.db'}"}
    if not args.no_server:
        server = MlflowServer(work / "server").start(timeout=120)
        stores["server"] = server.uri
    counter = iter(range(10**9))
    plain = {
        "no profiler": lambda ops, steps: run_loop(ops, steps),
        "no-op handler": lambda ops, steps: run_loop(ops, steps, lambda prof: None),
        "export_chrome_trace": lambda ops, steps: run_loop(
            ops, steps, lambda prof: prof.export_chrome_trace(str(work / f"export-{next(counter)}.json"))),
        "tensorboard_trace_handler": lambda ops, steps: run_loop(
            ops, steps, tensorboard_trace_handler(str(work / f"tb-{next(counter)}"))),
    }  # fmt: skip
    paths = dict(plain)
    for store, uri in stores.items():
        for process in ("inline", "helper"):
            paths[f"callback {process} ({store})"] = (
                lambda ops, steps, uri=uri, process=process: callback_loop(ops, steps, uri, process, work))
    run_loop(1000, 14, lambda prof: None)  # the profiler's first start is slow: not part of any path
    try:
        for size in args.sizes.split(","):
            ops, steps = map(int, size.split(":"))
            results: dict[str, list[dict]] = {name: [] for name in paths}
            for _ in range(args.repeats):  # round robin: a noisy moment hits every path alike
                for name, run in paths.items():
                    results[name].append(run(ops, steps))
            report(ops, steps, results)
    finally:
        if server is not None:
            server.stop()
    print("\nexporters and parsers: tensorboard_trace_handler and export_chrome_trace: Kineto's C++ JSON writer "
          "on the training thread;\n  callback inline: Kineto's raw events read by a background thread of the "
          "training process (numpy), the trace saved by that thread;\n  callback helper: Kineto's C++ JSON writer "
          "on the training thread, the file parsed by the helper process (orjson), numpy aggregation there.")
    print(f"\npeak RSS, one {args.rss_ops:,}-op cycle, fresh process each (sqlite):")
    for path in ("tensorboard", "inline", "helper"):
        out = subprocess.run([sys.executable, __file__, "--rss-child", path, "--rss-ops", str(args.rss_ops),
                              "--work", str(work)], capture_output=True, text=True, timeout=900)  # fmt: skip
        if out.returncode != 0:
            print(f"  {path}: failed: {out.stderr[-500:]}")
            continue
        rss = json.loads(out.stdout.strip().splitlines()[-1])
        helper = f", helper process {rss['helper_kb'] / 1024:.0f} MiB" if rss["helper_kb"] else ""
        print(f"  {path:<12} training process {rss['training_kb'] / 1024:.0f} MiB{helper}")


def report(ops: int, steps: int, results: dict[str, list[dict]]) -> None:
    cycles = results["no-op handler"][0]["kinds"].count("cycle")
    print(f"\n{ops:,} ops/step, {steps} steps ({cycles} cycles)")
    print(f"  {'path':<32}{'loop s':>8}{'drain s':>9}{'vs tensorboard':>16}{'repeats':>13}{'with drain':>12}"
          f"{'in-flight':>11}  notes")  # fmt: skip
    tensorboard = statistics.median(r["loop"] for r in results["tensorboard_trace_handler"])
    tensorboard_all = statistics.median(r["loop"] + r["drain"] for r in results["tensorboard_trace_handler"])
    for name, runs in results.items():
        loop = statistics.median(r["loop"] for r in runs)
        drain = statistics.median(r["drain"] for r in runs)
        whole = statistics.median(r["loop"] + r["drain"] for r in runs)
        # Each repeat against tensorboard's in the same round: how far one run's ratio can stray.
        paired = [r["loop"] / t["loop"] for r, t in zip(runs, results["tensorboard_trace_handler"])]
        spread = f"{min(paired):.2f}-{max(paired):.2f}x"
        ratio = in_flight_ratio(runs)
        notes = []
        if sum(r.get("spilled", 0) for r in runs):
            notes.append(f"{max(r['spilled'] for r in runs)} cycles spilled to the outbox (max_pending) and replayed")
        if runs[0].get("startup"):
            notes.append(f"helper start {statistics.median(r['startup'] for r in runs):.1f} s, parser {runs[0]['parser']}, "
                         f"{min(r['jobs'] for r in runs)} of {cycles} cycles through it")
        flight = f"{ratio:.2f}x" if ratio is not None else "-"
        print(f"  {name:<32}{loop:>8.2f}{drain:>9.2f}{loop / tensorboard:>15.2f}x{spread:>13}{whole / tensorboard_all:>11.2f}x{flight:>11}  {', '.join(notes)}")


if __name__ == "__main__":
    main()
