"""Time to data: from a profile's start until every cycle is readable in MLflow, against
`tensorboard_trace_handler` (whose files are on disk when the profile exits).

    python benchmarks/loop_cost.py [--repeats 3] [--hogs 0] [--schedules 3000:350:7,30000:70:7,3000:500:50]

Each schedule is OPS:STEPS:PERIOD: a step is `x.add_(y)` OPS times, profiled with one cycle every
PERIOD steps (schedule(wait=PERIOD-2, warmup=1, active=1)). The callback is used with a user's
defaults (the helper process, `flush_timeout_s=10`), created just before the loop (`--lead S`: S
seconds before it, the time counted from the profile's start), into a run the user started, on a
local sqlite store. Its time ends when `close()` has returned and every cycle is
readable in the store; a cycle still in the outbox then (not delivered within the budget) is
counted in "kept", and the figure is not a time to data. Medians of `--repeats` in one run, and
their ratio; with `--hogs 2`, two busy Python processes run beside it all. Beside each, how many
cycles were not yet delivered when the loop's last step was done (the profile's stop then waits
for them), and the helper's start-up: a fresh interpreter doing what the helper does before it can
send (its imports, MLflow's, the store opened); a loop shorter than that leaves every cycle to the
stop. A schedule whose runs kept a cycle prints FAIL instead of a ratio: its time is not a time to
data. The LOOP lines: the loop's own time, from the profile's start until its last step is done
(before the stop), with each handler, and their ratio: what the callback costs the training steps.

Then, with the helper warm and training idle between cycles, how long a cycle takes from its
queueing until it is readable (the helper finds it at its 50 ms look at the outbox), and `close()`
after the last one.

Last, the consumer's CPU per cycle: the outbox's drain (the helper's code) run in this process over
`--cpu-cycles` queued 3,000-op cycles, after one cycle that opens the store, split into preparing
and sending; and the same after
`--earlier` cycles of the run (each a step with 10 `record_function` regions, put into the run's
state in the outbox): a run's summary covers every cycle before it, so a long run's cycles cost more;
and, side by side, with `log_timeline=False`, what the cycle's MLflow trace costs.
"""

from __future__ import annotations

import argparse
import gc
import json
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
from mlflow_neuron._delivery import entries  # noqa: E402
from mlflow_neuron.cli.arguments import non_negative_float  # noqa: E402


def loop(ops: int, steps: int, period: int, handler, at_end=lambda: None) -> None:
    x, y = torch.zeros(64), torch.ones(64)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler,
                 schedule=schedule(wait=period - 2, warmup=1, active=1, repeat=0)) as prof:  # fmt: skip
        for _ in range(steps):
            for _ in range(ops):
                x.add_(y)
            prof.step()
        at_end()  # the last step is done; the profile's stop (and the callback's flush) is next


def with_tensorboard(work: Path, ops: int, steps: int, period: int) -> tuple[float, float]:
    """(seconds until the files are on disk, seconds of the loop itself)."""
    start, ended = time.perf_counter(), []
    loop(ops, steps, period, tensorboard_trace_handler(str(work / "tb")), lambda: ended.append(time.perf_counter()))
    return time.perf_counter() - start, ended[0] - start


def with_callback(work: Path, ops: int, steps: int, period: int, lead_s: float = 0.0) -> tuple[float, int, int, float]:
    """(seconds until every cycle was readable, cycles kept in the outbox, cycles not yet delivered
    when the loop's last step was done, seconds of the loop itself). `lead_s`: the callback is made this long before the
    profile starts (a script that loads its model meanwhile), and the time counts from the start."""
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run("0").info.run_id  # the user's run, made before the profile
    start = time.perf_counter()
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, outbox=work / "outbox")
    if lead_s:
        time.sleep(lead_s)
        start = time.perf_counter()
    left, ended = [], []
    loop(ops, steps, period, callback, lambda: (ended.append(time.perf_counter()),
                                                left.append(len(entries.listed(work / "outbox")))))  # fmt: skip
    callback.close()
    took = time.perf_counter() - start
    cycles = steps // period
    logged = len(client.get_metric_history(run_id, "profiler/total/self_cpu_time_us"))
    return took, cycles - logged, left[0], ended[0] - start


STARTUP = """
import os, sys
os.nice(10)
from mlflow_neuron._delivery import helper, mlflow_io
from mlflow_neuron._delivery.drain import Drain
from mlflow.tracking import MlflowClient
MlflowClient(sys.argv[1])._tracking_client.store
os._exit(0)
"""


def helper_startup(work: Path) -> float:
    """Seconds a fresh interpreter takes to do what the helper does before it can send a cycle: its
    imports at nice 10, then MLflow's, and the store opened (a store the user's run already made)."""
    uri = f"sqlite:///{work / 'startup.db'}"
    mlflow.MlflowClient(uri).create_run("0")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", STARTUP, uri], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def consumer_cpu_per_cycle(work: Path, cycles: int, earlier: int = 0, **options) -> tuple[float, float]:
    """CPU seconds per 3,000-op cycle of the drain, over `cycles` queued cycles (the store opened
    first), after `earlier` cycles of the run: (preparing them, then sending them). `options`: the
    callback's."""
    from mlflow_neuron._delivery.drain import Drain
    from mlflow_neuron._delivery.report import Reporter

    uri = f"sqlite:///{work / 'cpu.db'}"
    run_id = mlflow.MlflowClient(uri).create_run("0").info.run_id
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, outbox=work / "cpu-outbox", process="inline",
                                      flush_timeout_s=0.0, **options)  # fmt: skip
    callback._producer._kick = lambda *args: None  # queue only: nothing is drained here
    loop(3000, 7 * (cycles + 1), 7, callback)
    callback._producer._stop.set()
    drain = Drain(work / "cpu-outbox", Reporter(), credentials={uri: uri})
    first = sorted(p for p in (work / "cpu-outbox").iterdir() if not p.name.startswith("."))
    for entry in first[1:]:
        entry.rename(entry.with_name("." + entry.name))  # hidden: the first pass takes one cycle
    drain.once()
    for entry in first[1:]:
        entry.with_name("." + entry.name).rename(entry)
    if earlier:  # the run's state as `earlier` cycles of one step each would have left it
        state = work / "cpu-outbox" / f".keys-{run_id}.json"
        known = json.loads(state.read_text())
        known.pop("written_by", None)  # as another process would leave it: the drain reads it whole once
        for cycle in range(earlier):
            known["run_steps"]["steps"][f"{-1 - cycle}/{cycle}"] = {
                "total": [0.0, 20000.0 + cycle % 7], "regions": {f"layer_{k}": [0.0, 1000.0 + k] for k in range(10)}}
        state.write_text(json.dumps(known))
    gc.freeze()  # as the helper does once its imports are done: they are out of the cycle collector's sight
    preparing, prepare = [0.0], drain.prepare

    def timed_prepare(*args, **kwargs):
        before = time.process_time()
        try:
            return prepare(*args, **kwargs)
        finally:
            preparing[0] += time.process_time() - before

    drain.prepare = timed_prepare
    started = time.process_time()
    done = drain.once()
    total = time.process_time() - started
    count = max(done.count("delivered"), 1)
    assert done.count("delivered") == cycles, (done.count("delivered"), cycles)
    return preparing[0] / count, (total - preparing[0]) / count


def warm_helper(work: Path, cycles: int) -> tuple[float, float]:
    """With the helper warm (MLflow imported, the store open) and the training process idle between
    cycles: (median seconds from a cycle's queueing until it is out of the outbox, i.e. readable;
    seconds `close()` takes just after the last cycle is queued)."""
    uri = f"sqlite:///{work / 'warm.db'}"
    run_id = mlflow.MlflowClient(uri).create_run("0").info.run_id
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, outbox=work / "outbox")
    x, y, taken = torch.zeros(64), torch.ones(64), []
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=callback,
                 schedule=schedule(wait=0, warmup=1, active=1)) as prof:  # fmt: skip
        for cycle in range(cycles + 3):  # the first two wait for the helper's imports
            for _ in range(2):
                for _ in range(3000):
                    x.add_(y)
                prof.step()
            queued = time.perf_counter()
            if cycle == cycles + 2:
                break  # the last: close() waits for it
            while entries.listed(work / "outbox") and time.perf_counter() - queued < 60:
                time.sleep(0.001)
            taken.append(time.perf_counter() - queued)
    callback.close()
    return statistics.median(taken[2:]), time.perf_counter() - queued


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0; got {text!r}")
    return int(text)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        counts = [-1]
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1, comma-separated; got {text!r}")
    return counts


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--repeats", type=int, default=3)
    options.add_argument("--hogs", type=int, default=0, help="busy Python processes beside the benchmark")
    options.add_argument("--schedules", default="3000:350:7,30000:70:7,3000:500:50")
    options.add_argument("--cpu-cycles", type=int, default=20)
    options.add_argument("--lead", type=non_negative_float, default=0.0, help="seconds between making the callback and the "
                         "profile's start (default 0: just before it; the time counts from the start either way)")
    options.add_argument("--warm-cycles", type=_count, default=15, help="cycles timed one by one with the helper warm "
                         "(0: none)")
    options.add_argument("--earlier", default="1000", type=_counts, help="also the consumer's CPU after these many "
                         "cycles of the run (comma-separated; empty: none)")
    args = options.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    rows, loops = [], []
    try:
        for spec in [s for s in args.schedules.split(",") if s.strip()]:
            ops, steps, period = map(int, spec.split(":"))
            tb, ours, kept, unsent, tb_loop, our_loop = [], [], [], [], [], []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as scratch:
                    took, looped = with_tensorboard(Path(scratch), ops, steps, period)
                    tb.append(took)
                    tb_loop.append(looped)
                with tempfile.TemporaryDirectory() as scratch:
                    took, left, at_end, looped = with_callback(Path(scratch), ops, steps, period, args.lead)
                    ours.append(took)
                    kept.append(left)
                    unsent.append(at_end)
                    our_loop.append(looped)
            ratio = statistics.median(ours) / statistics.median(tb)
            shape = f"{ops:,} ops x {steps} steps, a cycle every {period}"
            rows.append((shape, f"{statistics.median(tb):.2f}", f"{statistics.median(ours):.2f}",
                         f"{ratio:.2f}x" if max(kept) == 0 else f"FAIL: {max(kept)} kept",
                         f"{statistics.median(unsent):.0f} of {steps // period}", f"{max(kept)}"))  # fmt: skip
            loops.append(f"LOOP {shape}: tensorboard {statistics.median(tb_loop):.2f} s, mlflow-neuron "
                         f"{statistics.median(our_loop):.2f} s: "
                         f"{statistics.median(our_loop) / statistics.median(tb_loop):.2f}x")  # fmt: skip
        startup = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as scratch:
                startup.append(helper_startup(Path(scratch)))
        warm = []
        for _ in range(args.repeats if args.warm_cycles else 0):
            with tempfile.TemporaryDirectory() as scratch:
                warm.append(warm_helper(Path(scratch), args.warm_cycles))
        cpu, untraced, later = [], [], {n: [] for n in args.earlier}
        for _ in range(args.repeats):  # one figure swings by a third on this shared machine: the median
            for earlier, found, options in [(0, cpu, {}), (0, untraced, {"log_timeline": False}),
                                            *((n, f, {}) for n, f in later.items())]:  # fmt: skip
                with tempfile.TemporaryDirectory() as scratch:
                    found.append(consumer_cpu_per_cycle(Path(scratch), args.cpu_cycles, earlier, **options))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    lead = f", the callback made {args.lead:g} s before the profile" if args.lead else ""
    print(f"torch {torch.__version__}, mlflow {mlflow.__version__}, {args.hogs} CPU hog(s), "
          f"median of {args.repeats}{lead}")
    header = ("schedule", "tensorboard (s)", "mlflow-neuron, data readable (s)", "ratio",
              "not yet delivered at the last step", "kept (worst repeat)")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")

    print(f"\nthe helper's start-up, a fresh interpreter until it can send (its imports at nice 10, MLflow's, the "
          f"store opened): {statistics.median(startup):.2f} s (median of {len(startup)}: {min(startup):.2f}-"
          f"{max(startup):.2f}); until then the cycles wait in the outbox, and a stop drains them itself")

    for line in loops:
        print(line)

    def ms(found: list[tuple[float, float]]) -> str:
        total = [a + b for a, b in found]
        return (f"{statistics.median(total) * 1000:.0f} ms (median of {len(found)}: {min(total) * 1000:.0f}-"
                f"{max(total) * 1000:.0f}; preparing {statistics.median(a for a, _ in found) * 1000:.0f} ms, "
                f"sending {statistics.median(b for _, b in found) * 1000:.0f} ms)")

    if args.warm_cycles:
        print(f"\na warm helper, training idle between {args.warm_cycles} cycles of 3,000 ops (median of {args.repeats}):")
        for k, what in enumerate(("a cycle, from queued until readable", "close(), from the last cycle queued")):
            print(f"  {what}: {statistics.median(r[k] for r in warm) * 1000:.0f} ms")
    print(f"\nthe consumer's CPU per 3,000-op cycle, over {args.cpu_cycles} cycles: {ms(cpu)}")
    print(f"  with log_timeline=False (no MLflow trace a cycle): {ms(untraced)}")
    for earlier, found in later.items():
        print(f"  after {earlier:,} cycles of the run (10 regions a step): {ms(found)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
