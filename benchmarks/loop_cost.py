"""What continuous profiling costs a training loop, whole: the loop's wall time with each exporter.

    python benchmarks/loop_cost.py [--repeats 3] [--sizes 3000:350,30000:70] [--rss-ops 100000]

The loop is `x.add_(y)` N times a step, profiled with schedule(wait=5, warmup=1, active=1,
repeat=0): one cycle every 7 steps. In one run it times, median of `--repeats`:

- no profiler; the profiler with a no-op handler; `export_chrome_trace` per cycle;
  `tensorboard_trace_handler`;
- MLflowProfilerCallback in-process (`process="inline"`) and with the helper process
  (`process="helper"`), each against a local sqlite store and a real `mlflow server` (127.0.0.1).

The callback is used with a user's defaults: created just before the loop (no `start_helper()`),
into a run the user started. Where the exit waits (inline, and the helper with
`deliver_after_exit=False`), `flush_timeout_s` is raised to 300 s so that every cycle is delivered
before `close()` returns: the whole cost is paid inside the figure, none of it left to the outbox.

"loop" is the wall time of the steps; "exit" the profiler's exit plus `close()`; "whole" is loop +
exit: what the user pays from the profile's start until the run is closed. With the helper's
default (`deliver_after_exit`), the exit does not wait for queued cycles: the helper delivers them
afterwards, and the notes say how long after `close()` every cycle was in MLflow (checked in the
store after each run). "exit waits" is `deliver_after_exit=False`: the exit waits for every cycle. "vs tb" compares medians with `tensorboard_trace_handler`'s;
"repeats" is the lowest and highest ratio of one repeat's whole run to tensorboard's in the same
round. "in-flight" compares the median step while a cycle is being processed (handed off, not yet
delivered) with the median step with none; the steps that end a cycle (the trace save) are counted
in neither. For the helper: "ready" is the time from the callback's creation until the helper took
its settings, and "cycles/s" how many cycles it delivered per second of its sender's busy time.
Last, the peak RSS of the training process and of the helper for one `--rss-ops`-op cycle, each
path in a fresh process.
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
    entered = time.perf_counter()
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
    return {"loop": loop, "drain": time.perf_counter() - drain_start + (start - entered), "times": times, "kinds": kinds}


def callback_loop(ops, steps, uri, process, work, after_exit=True) -> dict:
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run("0").info.run_id
    # The user's defaults, except where the exit waits: a budget long enough that every cycle is
    # delivered before close() returns (none of the cost left to the outbox).
    waits = process == "inline" or not after_exit
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, process=process, outbox=work / "outbox",
                                      deliver_after_exit=after_exit, **({"flush_timeout_s": 300} if waits else {}))
    result = run_loop(ops, steps, callback, callback)
    t = time.perf_counter()
    callback.close()
    closed = time.perf_counter()
    result["drain"] += closed - t
    if not callback.wait_delivered(600):
        raise RuntimeError("the helper did not deliver within 600 s after the exit")
    result["after"] = time.perf_counter() - closed  # delivered after the exit (the helper alone)
    logged = len(client.get_metric_history(run_id, "profiler/total/self_cpu_time_us"))
    if logged != result["kinds"].count("cycle") or callback.outbox_records:
        raise RuntimeError(f"{logged} cycles in MLflow, {result['kinds'].count('cycle')} profiled")
    sender = callback._sender
    result["spilled"] = callback.reporter.counts.get("stored_in_outbox", 0)
    result["behind"] = callback.reporter.counts.get("falling_behind", 0)
    if hasattr(sender, "ready_after_s"):  # the helper process: None if it was not ready before the exit
        result.update(parser=sender.parser, jobs=sender.jobs_sent, ready=sender.ready_after_s)
    busy = getattr(sender, "delivery_busy_s", None)
    result["rate"] = callback.cycles_logged / busy if busy and callback.cycles_logged else None
    handed = getattr(getattr(sender, "handed", None), "cycles", 0)
    result["handed"] = handed
    result["rate_after"] = handed / result["after"] if handed and result["after"] > 0 else None
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
    parser.add_argument("--sizes", default="3000:350,30000:70", help="ops per step : steps, comma-separated")
    parser.add_argument("--rss-ops", type=int, default=100_000, help="0: no memory figures")
    parser.add_argument("--no-server", action="store_true", help="sqlite only")
    parser.add_argument("--only", help="comma-separated parts of path names to run (tensorboard and the "
                        "no-op handler always run), e.g. 'helper'")
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
        paths[f"callback helper, exit waits ({store})"] = (
            lambda ops, steps, uri=uri: callback_loop(ops, steps, uri, "helper", work, after_exit=False))
    if args.only:
        wanted = args.only.split(",")
        paths = {name: run for name, run in paths.items()
                 if name in ("no-op handler", "tensorboard_trace_handler") or any(w in name for w in wanted)}  # fmt: skip
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
    if not args.rss_ops:
        return
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
    print(f"  {'path':<32}{'loop s':>8}{'vs tb':>8}{'exit s':>8}{'whole s':>9}{'vs tb':>8}{'repeats':>13}"
          f"{'in-flight':>11}  notes")  # fmt: skip
    tensorboard = results["tensorboard_trace_handler"]
    tb_loop = statistics.median(r["loop"] for r in tensorboard)
    tb_whole = statistics.median(r["loop"] + r["drain"] for r in tensorboard)
    for name, runs in results.items():
        loop = statistics.median(r["loop"] for r in runs)
        drain = statistics.median(r["drain"] for r in runs)
        whole = statistics.median(r["loop"] + r["drain"] for r in runs)
        # Each repeat against tensorboard's in the same round: how far one run's ratio can stray.
        paired = [(r["loop"] + r["drain"]) / (t["loop"] + t["drain"]) for r, t in zip(runs, tensorboard)]
        spread = f"{min(paired):.2f}-{max(paired):.2f}x"
        ratio = in_flight_ratio(runs)
        notes = []
        if sum(r.get("spilled", 0) for r in runs):
            notes.append(f"{max(r['spilled'] for r in runs)} cycles spilled to the outbox (max_pending) and replayed")
        if sum(r.get("behind", 0) for r in runs):
            notes.append(f"'falling behind' warned in {sum(1 for r in runs if r['behind'])} of {len(runs)}")
        if "ready" in runs[0]:
            ready = [r["ready"] for r in runs if r["ready"] is not None]
            late = f" ({len(runs) - len(ready)} of {len(runs)} not ready before the exit)" if len(ready) < len(runs) else ""
            when = f"ready {statistics.median(ready):.2f} s after creation{late}" if ready else \
                f"not ready before the exit in {len(runs)} of {len(runs)}"
            parser = next((r["parser"] for r in runs if r["parser"]), None)
            notes.append(f"{when}{f', parser {parser}' if parser else ''}, {min(r['jobs'] for r in runs)} of {cycles} "
                         "cycles through it")  # fmt: skip
        rates = [r["rate"] for r in runs if r.get("rate")]
        if rates:
            notes.append(f"{statistics.median(rates):.0f} cycles/s delivered while busy")
        if any(r.get("handed") for r in runs):
            after = [r["rate_after"] for r in runs if r.get("rate_after")]
            notes.append(f"{statistics.median(r['handed'] for r in runs):.0f} cycles delivered after the exit, all in "
                         f"MLflow {statistics.median(r['after'] for r in runs):.2f} s after close() returned"
                         + (f" ({statistics.median(after):.0f} cycles/s)" if after else ""))
        flight = f"{ratio:.2f}x" if ratio is not None else "-"
        print(f"  {name:<32}{loop:>8.2f}{loop / tb_loop:>7.2f}x{drain:>8.2f}{whole:>9.2f}{whole / tb_whole:>7.2f}x"
              f"{spread:>13}{flight:>11}  {', '.join(notes)}")


if __name__ == "__main__":
    main()
