"""Where a cycle's time goes after the training thread, stage by stage, and the whole cycle against
torch's own `prof.events()` + `key_averages()` of the same kind of cycle, measured in one run.

    python benchmarks/helper_cycle_cost.py [--ops 50000] [--small 3000] [--reps 3] [--rss-ops 100000] [--shapes]

Each cycle is N `torch.add` ops, each launching one fake "neuron" kernel (tests/fake_device, a
PrivateUse1 Kineto profiler compiled with g++): 50,000 ops make 50,000 kernels. Per cycle:

- the training thread: the callback's own reader (`CycleReader.read(hand_off=True)`, as the
  callback calls it with its defaults: Kineto's C++ writer saves the trace into the cycle's folder);
- the helper's work, in this process, on that job, as the helper's drain does it:
  `Preparer.prepare` (read the saved trace once, link, traffic, aggregate, timeline, the op table's
  text, the rank summary, the tables, the trace gzipped), `with_run_summary`, then
  `RunLogger.deliver` into a local sqlite store (metrics and tags, the files, the MLflow trace),
  by one RunLogger for the run, warmed first, as the helper's courier keeps one, each cycle at a
  step of its own and delivered as a first attempt (its MLflow trace written, as a new cycle's is);
- torch's own `prof.events()` + `key_averages()` on a fresh cycle of the same shape.

Each stage is timed by a wrapper the benchmark puts around the function that does it (nothing in
the product is timed). "other" is what `prepare` spent outside the named stages. The helper is a
process of its own whose heap is frozen after its imports (`gc.freeze()`, so the cycle collector
does not scan MLflow's and pandas' objects again and again): here the heap is frozen after the
warm cycle. The two processes' garbage is kept apart: after the training part, the cycle's torch
profiler, garbage of the training process that the helper never holds (freeing it took 60-190 ms at
50,000 ops), is collected and timed apart ("collector"), and counted in the whole cycle; after the
helper's part, its own cyclic garbage is collected and timed as the helper's ("garbage"). The helper's CPU (process time) per cycle is printed beside
its wall time. Then the peak RSS (VmHWM) of a fresh
process that only prepares a saved cycle of --rss-ops ops, as the helper does
(`MLFLOW_NEURON_RSS_ROOT=<another checkout>` prepares the same cycle with that checkout's code, to
compare). Medians over --reps cycles.
No timed assertions: this prints tables and ratios.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("FAKE_NEURON_KERNELS", "aten::add=1")
os.environ.setdefault("FAKE_NEURON_MODE", "kernels")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

STAGES = [  # (label, module, attribute): the function that does the stage, where it is called from
    ("read (+ rank summary)", "mlflow_neuron._trace.summarize", "read_chrome_file"),
    ("link", "mlflow_neuron._trace.summarize", "event_tree"),
    ("traffic", "mlflow_neuron._trace.summarize", "event_traffic"),
    ("aggregate", "mlflow_neuron._trace.summarize", "aggregate"),
    ("timeline", "mlflow_neuron._trace.summarize", "build_timeline"),
    ("op table text", "mlflow_neuron._trace.summarize", "cycle_table"),
    ("rank summary (made)", "mlflow_neuron._trace.summarize.RankPass", "into"),
    ("metrics", "mlflow_neuron._record.prepare.Preparer", "_metrics"),
    ("tables (build)", "mlflow_neuron._record.prepare", "ops_table"),
    ("tables (build)", "mlflow_neuron._record.prepare", "step_tables"),
    ("tables (write)", "mlflow_neuron._record.prepare", "write_table"),
    ("timeline files", "mlflow_neuron._record.prepare.TraceDraft", "of"),
    ("timeline files", "mlflow_neuron._record.prepare.TraceText", "of"),
    ("staging (gzip trace)", "mlflow_neuron._record.prepare", "gzip_file"),
]
UPLOAD_STAGES = [
    ("upload: metrics, tags", "mlflow.tracking.MlflowClient", "log_batch"),
    ("upload: files", "mlflow_neuron._delivery.mlflow_io.RunLogger", "_log_generated_files"),
    ("upload: manifest", "mlflow_neuron._delivery.mlflow_io.RunLogger", "_log_checked_manifest"),
    ("upload: MLflow trace", "mlflow_neuron._delivery.mlflow_io.RunLogger", "_log_timelines"),
]


CYCLES = itertools.count()  # the run's cycles so far
SHAPES = {"record_shapes": False}  # --shapes: every cycle profiled with record_shapes=True


class Stopwatch:
    """Wraps each stage's function; wall seconds per label, counting nested calls once."""

    def __init__(self, stages):
        import importlib

        self.seconds: dict[str, float] = defaultdict(float)
        self._depth = 0
        for label, where, name in stages:
            try:
                owner = importlib.import_module(where)
            except ModuleNotFoundError:  # a class: module.Class
                module_name, _, cls = where.rpartition(".")
                owner = getattr(importlib.import_module(module_name), cls, None)
            real = getattr(owner, "__dict__", {}).get(name) or getattr(owner, name, None)
            if real is None:  # an older checkout without this stage (run from its own benchmarks/)
                continue
            setattr(owner, name, self._timed(label, real))

    def _timed(self, label, real):
        func = real.__func__ if isinstance(real, (staticmethod, classmethod)) else real

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        if isinstance(real, classmethod):
            return classmethod(timed)
        if isinstance(real, staticmethod):
            return staticmethod(timed)
        return timed

    def take(self) -> dict[str, float]:
        found, self.seconds = dict(self.seconds), defaultdict(float)
        return found


def fake_device() -> str | None:
    import fake_device as fd

    try:
        fd.activate(fd.build(Path(tempfile.gettempdir()) / f"fake_neuron_build_{os.getuid()}"))
    except fd.FakeDeviceUnavailable as reason:
        return str(reason).splitlines()[0]
    return None


def cycle(ops: int, on_ready, device: bool, wait: int = 0):
    """`wait` empty steps first: the cycle is at step `wait + 1` (each of a run's cycles at its own step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    a, b = torch.ones(4), torch.ones(4)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device else [])
    with profile(activities=activities, schedule=schedule(wait=wait, warmup=1, active=1), on_trace_ready=on_ready,
                 **SHAPES) as prof:  # fmt: skip
        for _ in range(wait):
            prof.step()
        for _ in range(2):
            for _ in range(ops):
                torch.add(a, b)
            prof.step()


def torch_table(ops: int, device: bool) -> float:
    seconds = []
    cycle(ops, lambda prof: seconds.append(_timed(lambda: (prof.events(), prof.key_averages()))), device)
    return seconds[0]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ours(ops: int, device: bool, logger, watch: Stopwatch, work: Path) -> dict[str, float]:
    """One cycle: `logger` is the run's one RunLogger, kept across cycles as the helper's courier
    keeps it (the run's state read once, not per cycle)."""
    from mlflow_neuron._capture.distributed import current_rank
    from mlflow_neuron._capture.reader import CycleReader
    from mlflow_neuron._delivery.report import Reporter
    from mlflow_neuron._record.prepare import Preparer

    reporter = Reporter(strict=True)
    reader = CycleReader(reporter, current_rank(), all_ranks=False, profile_output_dir=None, max_file_bytes=None,
                         export_trace=True, log_timeline=True, timeline_max_spans=2000, created_ns=time.time_ns())  # fmt: skip
    jobs, train = [], []

    def on_ready(prof):
        start = time.perf_counter()
        staged = Path(tempfile.mkdtemp(dir=work))
        jobs.append(reader.read(prof, [], hand_off=True, staged_dir=staged))
        train.append(time.perf_counter() - start)

    cycle(ops, on_ready, device, wait=next(CYCLES))  # a step of its own: its MLflow trace is written, not found done
    [job] = jobs
    # The training process's garbage: this cycle's torch profiler (freeing it took 60-190 ms at
    # 50,000 ops), which the helper process never holds. Timed apart and counted in the whole cycle;
    # the helper's own garbage was collected, timed, at the end of its previous cycle (below).
    collected = _timed(gc.collect)
    watch.take()
    wall, cpu = time.perf_counter(), time.process_time()
    preparer = Preparer(reporter, top_k=50)
    delivery = preparer.with_run_summary(preparer.prepare(job))
    prepared_wall, prepared_cpu = time.perf_counter() - wall, time.process_time() - cpu
    stages = watch.take()
    wall, cpu = time.perf_counter(), time.process_time()
    logger.deliver(delivery, fresh=True)  # a first attempt, as the courier says it (no search for an earlier write)
    upload_wall, upload_cpu = time.perf_counter() - wall, time.process_time() - cpu
    stages.update(watch.take())
    wall, cpu = time.perf_counter(), time.process_time()
    gc.collect()  # the cyclic garbage this cycle's helper work left, charged to it (the helper's collector would free it later)
    garbage_wall, garbage_cpu = time.perf_counter() - wall, time.process_time() - cpu
    named = sum(v for k, v in stages.items() if not k.startswith("upload"))
    stages["other (prepare)"] = prepared_wall - named
    stages["garbage (collected)"] = garbage_wall
    return {**stages, "training thread": train[0], "collector": collected, "prepare": prepared_wall, "upload": upload_wall,
            "helper cpu": prepared_cpu + upload_cpu + garbage_cpu,
            "helper": prepared_wall + upload_wall + garbage_wall}  # fmt: skip


def rss_child(ops: int) -> None:
    """Saves one cycle's trace, then in a fresh process prepares it as the helper does; prints the
    peak RSS (MiB) before and after preparing."""
    from mlflow_neuron._capture.distributed import current_rank
    from mlflow_neuron._capture.reader import CycleReader
    from mlflow_neuron._delivery.report import Reporter

    work = Path(tempfile.mkdtemp())
    (work / "staged").mkdir()
    reader = CycleReader(Reporter(strict=True), current_rank(), all_ranks=False, profile_output_dir=None,
                         max_file_bytes=None, export_trace=True, log_timeline=True, timeline_max_spans=2000,
                         created_ns=time.time_ns())  # fmt: skip
    jobs = []
    cycle(ops, lambda prof: jobs.append(reader.read(prof, [], hand_off=True, staged_dir=work / "staged")),
          fake_device() is None)  # fmt: skip
    message = jobs[0].to_message()
    code = ("import json, sys; from mlflow_neuron._record.job import CycleJob\n"
            "from mlflow_neuron._record.prepare import Preparer; from mlflow_neuron._delivery.report import Reporter\n"
            "def hwm():  # this process's own peak (ru_maxrss would carry its parent's over the exec)\n"
            "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024\n"
            "import dataclasses; from mlflow_neuron._trace.summarize import CycleSettings\n"
            "message = json.loads(sys.stdin.read()); known = {f.name for f in dataclasses.fields(CycleSettings)}\n"
            "message['source']['settings'] = {k: v for k, v in message['source']['settings'].items() if k in known}\n"
            "job = CycleJob.from_message(message)  # settings an older checkout knows (for --rss against it)\n"
            "before = hwm()\n"
            "Preparer(Reporter(strict=True), top_k=50).prepare(job)\n"
            "print(before, hwm())\n")  # fmt: skip
    import json

    env = {**os.environ, "PYTHONPATH": os.environ.get("MLFLOW_NEURON_RSS_ROOT", str(ROOT))}  # another checkout's code
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(message), capture_output=True, text=True,
                          env=env, cwd=work, timeout=1200)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    before, after = map(float, done.stdout.split())
    print(f"helper's peak RSS preparing a {ops:,}-op cycle (fresh process, imports included): "
          f"{after:,.0f} MiB ({before:,.0f} MiB before the cycle)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=50_000, help="ops (and kernels) of the large cycle")
    parser.add_argument("--small", type=int, default=3_000, help="ops of the small cycle")
    parser.add_argument("--reps", type=int, default=3, help="cycles per shape (medians)")
    parser.add_argument("--rss-ops", type=int, default=100_000, help="ops of the peak-RSS cycle (0: skip)")
    parser.add_argument("--shapes", action="store_true", help="profile with record_shapes=True (each op's input "
                        "dims and types in the trace, as the example records them)")  # fmt: skip
    parser.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    SHAPES["record_shapes"] = args.shapes
    if args.rss_child:
        rss_child(args.rss_child)
        return
    why = fake_device()
    device = why is None
    if why:
        print(f"note: no fake device ({why}): CPU ops only")
    import mlflow
    from mlflow.tracking import MlflowClient

    work = Path(tempfile.mkdtemp(prefix="helper-cycle-cost-"))
    os.chdir(work)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("cost")).info.run_id
    watch = Stopwatch(STAGES + UPLOAD_STAGES)
    mlflow.set_tracking_uri(uri)
    from mlflow_neuron._delivery.mlflow_io import RunLogger
    from mlflow_neuron._record.model import RunRef

    logger = RunLogger(RunRef(uri, run_id))
    logger.warm()  # as the courier does: the store opened and the run's state read before the first cycle
    for ops in (args.ops, args.small):
        ours(ops, device, logger, watch, work)  # warm: imports, the store's first requests
        gc.collect()
        gc.freeze()  # as the helper freezes what its imports and stores made (`_delivery/helper.py`)
        found = [ours(ops, device, logger, watch, work) for _ in range(args.reps)]
        baseline = statistics.median(torch_table(ops, device) for _ in range(args.reps))
        median = {key: statistics.median(f.get(key, 0.0) for f in found) for key in found[0]}
        whole = median["training thread"] + median["collector"] + median["helper"]
        print(f"\n{ops:,} ops{' + ' + format(ops, ',') + ' kernels' if device else ''} a cycle"
              f"{', shapes recorded' if args.shapes else ''}, "
              f"medians of {args.reps} (ms):")
        for key in [k for k in found[0] if k not in ("training thread", "collector", "prepare", "upload", "helper", "helper cpu")]:
            print(f"  {key:<26} {median[key] * 1000:9.1f}")
        print(f"  {'prepare (all)':<26} {median['prepare'] * 1000:9.1f}")
        print(f"  {'upload (all)':<26} {median['upload'] * 1000:9.1f}")
        print(f"  {'helper (wall)':<26} {median['helper'] * 1000:9.1f}   its CPU {median['helper cpu'] * 1000:.1f}")
        print(f"  {'training thread':<26} {median['training thread'] * 1000:9.1f}")
        print(f"  {'collector (training proc.)':<26} {median['collector'] * 1000:9.1f}   the training side's garbage, collected apart")
        print(f"  {'events() + key_averages()':<26} {baseline * 1000:9.1f}")
        print(f"  RATIO whole cycle (training thread + collector + helper) vs torch: {baseline / whole:.1f}x cheaper")
        print(f"  RATIO training thread vs torch: {baseline / median['training thread']:.1f}x cheaper")
    if args.rss_ops:
        child = [sys.executable, __file__, "--rss-child", str(args.rss_ops), *(["--shapes"] if args.shapes else [])]
        done = subprocess.run(child, capture_output=True,
                              text=True, timeout=1800)  # fmt: skip
        print(done.stdout.strip() or done.stderr[-2000:])
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")


if __name__ == "__main__":
    main()
