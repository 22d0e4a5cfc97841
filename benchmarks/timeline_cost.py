"""Cost of a cycle's timeline (issue 12) against the cycle's aggregation, at 10k and 100k ops.

    python benchmarks/timeline_cost.py [--ops 10000 100000] [--reps 3] [--max-spans 2000]

Each cycle: `--steps` ProfilerStep ranges of `torch.add` ops, each op launching one fake "neuron"
kernel (tests/fake_device, needs g++; without it CPU ops only, and a note says so). Per cycle,
medians over --reps fresh cycles, seconds:

  read              `raw_events_from_kineto(prof)`: what every cycle already pays in the sender
  aggregate         `_aggregate.aggregate(raw)`: the same
  streams           what `read_kineto_cycle(prof)` adds to that read: each device event's stream
                    (and the shapes reader), from the same list of Kineto events
  build             `build_timeline(raw, inputs=...)`
  log               `log_timeline` into a local sqlite store (a fresh run per cycle), spans as
                    the trace's artifact (`--span-storage tracking_store`: in the span table)

The timeline's own cost is streams + build, given against aggregate alone and
against read + aggregate (the fast path); then with the logging.

Then the whole callback cycle, `MLflowProfilerCallback(log_timeline=True)` against `False`, into
the same kind of store (`--callback-reps` cycles each, medians):

  training ms       the callback call on the training thread (the sender does the rest)
  sender s          from that call's return until `flush()` returns: read, aggregate, timeline,
                    tables, trace gzip, metrics, artifacts and (on) the MLflow trace
  timeline.json KB  the staged timeline file uploaded with the cycle

No assertions.
"""

from __future__ import annotations

import argparse
import atexit
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
os.environ.setdefault("FAKE_NEURON_KERNELS", "aten::add=1")
os.environ.setdefault("FAKE_NEURON_MODE", "kernels")


def profile_cycle(ops: int, steps: int, with_device: bool, on_trace_ready=None):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if with_device else [])
    a, b = torch.ones(4), torch.ones(4)
    # A schedule makes prof.step() record ProfilerStep#N ranges; the cycle ends at the last step.
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=on_trace_ready or (lambda p: None)) as prof:  # fmt: skip
        prof.step()  # the warmup step, empty
        for _ in range(steps):
            for _ in range(ops // steps):
                torch.add(a, b)
            prof.step()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-spans", type=int, default=2000)
    parser.add_argument("--span-storage", choices=["artifact", "tracking_store"], default="artifact")
    parser.add_argument("--callback-reps", type=int, default=2, help="cycles per setting of the callback section")
    args = parser.parse_args()

    from extraction import activate_fake_device

    why_not = activate_fake_device()
    device = "neuron" if why_not is None else "cpu"
    if why_not:
        print(f"note: no fake device ({why_not}); CPU ops only")

    from mlflow import MlflowClient

    from mlflow_neuron._mlflow_traces import log_timeline
    from mlflow_neuron._aggregate import aggregate
    from mlflow_neuron._kineto import raw_events_from_kineto
    from mlflow_neuron._timeline import build_timeline
    from mlflow_neuron._timeline_sources import _inputs_from_events

    store = pathlib.Path(tempfile.mkdtemp(prefix="timeline_cost_"))
    atexit.register(shutil.rmtree, store, ignore_errors=True)
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.create_experiment("timeline-cost", artifact_location=str(store / "artifacts"))

    header = ("ops/cycle", "events", "read s", "aggregate s", "streams s", "build s", "log s", "spans",
              "dropped", "timeline / aggregate", "timeline / (read + aggregate)",
              "with log / (read + aggregate)")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for ops in args.ops:
        times: dict[str, list[float]] = {k: [] for k in ("read", "aggregate", "streams", "build", "log")}
        for _ in range(args.reps):
            prof = profile_cycle(ops, args.steps, device != "cpu")
            t0 = time.perf_counter()
            raw = raw_events_from_kineto(prof)
            t1 = time.perf_counter()
            aggregate(raw, device=device, device_profiled=device != "cpu")
            aggregated = time.perf_counter()
            results = prof.profiler.kineto_results
            events, origin = results.events(), results.trace_start_ns()  # read_kineto_cycle shares these
            t2 = time.perf_counter()
            inputs = _inputs_from_events(events, raw, origin)
            t3 = time.perf_counter()
            timeline = build_timeline(raw, cycle_step=prof.step_num, max_spans=args.max_spans, inputs=inputs)
            t4 = time.perf_counter()
            run_id = client.create_run(experiment).info.run_id
            t5 = time.perf_counter()
            log_timeline(client, run_id, experiment, timeline, device=device, span_storage=args.span_storage)
            t6 = time.perf_counter()
            for key, value in zip(times, (t1 - t0, aggregated - t1, t3 - t2, t4 - t3, t6 - t5)):
                times[key].append(value)
            events = len(raw)
            del prof
        m = {k: statistics.median(v) for k, v in times.items()}
        own = m["streams"] + m["build"]
        fast = m["read"] + m["aggregate"]
        print(f"| {ops:,} | {events:,} | {m['read']:.3f} | {m['aggregate']:.3f} | {m['streams']:.3f} | "
              f"{m['build']:.3f} | {m['log']:.3f} | {len(timeline.spans):,} | {timeline.dropped:,} | "
              f"{own / m['aggregate']:.0%} | {own / fast:.0%} | {(own + m['log']) / fast:.0%} |")  # fmt: skip
    print("timeline = streams + build; read + aggregate is the cycle's fast path in the sender")
    callback_cost(args, device, store)


def callback_cost(args, device: str, store: pathlib.Path) -> None:
    """The whole cycle through `MLflowProfilerCallback`, timeline on and off."""
    import mlflow

    from mlflow_neuron import MLflowProfilerCallback

    uri = f"sqlite:///{store / 'callback.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("callback-cost", artifact_location=str(store / "callback-artifacts"))
    header = ("ops/cycle", "log_timeline", "training ms", "sender s", "timeline.json KB", "trace spans")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for ops in args.ops:
        for on in (False, True):
            training, sender = [], []
            run_id = client.create_run(experiment).info.run_id
            callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, strict=True, log_timeline=on,
                                              timeline_max_spans=args.max_spans, outbox=store / "outbox")  # fmt: skip

            def timed(prof):
                t0 = time.perf_counter()
                callback(prof)
                t1 = time.perf_counter()
                callback.flush()
                training.append(t1 - t0)
                sender.append(time.perf_counter() - t1)

            for _ in range(args.callback_reps):
                profile_cycle(ops, args.steps, device != "cpu", on_trace_ready=timed)
            callback.close()
            kb, spans = "-", "-"
            if on:
                step_dir = next(p for p in (store / "callback-artifacts").glob(f"{run_id}/artifacts/profiler/step_*"))
                kb = f"{(step_dir / 'timeline.json').stat().st_size / 1024:,.0f}"
                traces = client.search_traces(locations=[experiment], run_id=run_id)
                spans = ", ".join(sorted({str(len(t.data.spans)) for t in traces}))
            print(f"| {ops:,} | {on} | {statistics.median(training) * 1000:.1f} | {statistics.median(sender):.3f} | "
                  f"{kb} | {spans} |")  # fmt: skip


if __name__ == "__main__":
    main()
