"""The gate's calibration matrix (issue 36): A/A pairs on CPU and A/B pairs on the fake device,
under each load pattern, with 1, 2, 3 and 4 cycles a run.

    python benchmarks/calibration_matrix.py [--pairs 20] [--loads quiet,one,both,periodic,workers] [--cycles 1,2,3,4]
                                            [--gap-s 0] [--rotation] [--busy-shares 0.1,0.25,0.5,1]
                                            [--store sqlite:///...]

Every run is a real torch.profiler run through `MLflowProfilerCallback` into a sqlite store,
profiled with `schedule(wait=1, warmup=1, active=5, repeat=CYCLES)`, a run's cycles back to back
or `--gap-s` apart (a pause after each is handed over, as a training job's steps space them: it
tells a stretch of weather that covers a whole run from a shift that lasts), and each pair is its own
experiment, judged as a CI job would: `mlflow-neuron compare --experiment E --baseline base
--fail-if-slower 10` (tests/calibration_runs.py). The loads:

- `quiet`: nothing added;
- `one`: two CPU hogs beside the candidate run only;
- `both`: two CPU hogs beside each run;
- `periodic`: two CPU hogs, 3 s on and 3 s off, for the whole of each pair;
- `workers`: no hogs, but the job's own input pipeline: a DataLoader with 2 worker processes,
  each kept busy (20 ms of Python a batch, taken as they come by a thread of the job) beside each
  run. They are the job's child processes, so the host is quiet and host time is judged.

A/A on CPU is naive RMSNorm twice (host time); A/B is the same loop on the fake PrivateUse1
device whose kernels are 30% longer in the candidate (device time, with the fake device's seeded
jitter and stalls). `--rotation` adds A/A pairs profiled in rotation: naive RMSNorm twice as the
two variants of one `interleaved()` call (base, same, base, ...), under every load but `one`.
Prints one table: per cell, how often the gate fired on A/A (should be 0 of
N) and how often it found the +30% (should be N of N), with the A/A pairs' total verdicts.
`--busy-shares` then judges the same A/A pairs (with `--rotation`, those in rotation too) again
with each `--host-busy-share` (the share of the host's CPUs busy elsewhere beyond which host time
is not judged): per share, the alarms and how many pairs got a verdict on their host time at
all, the price of a lower share. `--store`
judges the runs a former matrix logged (its printed store) instead of logging new ones.
Asserts nothing: its CPU figures follow the machine's load. The hogs make it unfit for a shared
machine where others are timing things; `--loads quiet --pairs 1` is a smoke run.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext

ROOT = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT.parent), str(ROOT.parent / "tests"), str(ROOT)]

LOADS = ("quiet", "one", "both", "periodic", "workers")
HOGS_BESIDE = {"quiet": (0, 0), "one": (0, 2), "both": (2, 2), "periodic": (0, 0), "workers": (0, 0)}  # (base, cand)
LOADER_WORKERS = {"workers": 2}  # busy DataLoader workers of the job, beside each run
KINDS = {"aa": ("base", 1.0, "same", 1.0), "ab": ("base", 1.0, "slower", 1.3)}  # and "rot": A/A in rotation
ROTATION_HOGS = {"quiet": 0, "both": 2, "periodic": 0, "workers": 0}  # in rotation both runs share the load: no `one`


def make_cells(uri: str, so: str | None, plan: list[tuple[str, str, int, int]], gap_s: float = 0.0) -> None:
    """Worker: logs each pair of `plan` ((kind, load, cycles, index)) into its own experiment, the
    cycles of a run `gap_s` apart."""
    import mlflow
    import torch
    from calibration import PeriodicHogs
    from calibration_runs import cpu_hogs, kernels
    from rmsnorm_variants import garbage_collector_paused
    from torch.profiler import ProfilerActivity
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    torch.set_num_threads(1)  # as the example does
    mlflow.set_tracking_uri(uri)
    if so is not None:
        import fake_device

        fake_device.activate(pathlib.Path(so))
    for kind, load, cycles, index in plan:
        mlflow.set_experiment(experiment(kind, load, cycles, index))
        if kind == "rot":
            rotation_pair(cycles, load)
            continue
        base_name, base_scale, name, scale = KINDS[kind]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if kind == "ab" else [])
        with PeriodicHogs(2, 3.0) if load == "periodic" else nullcontext():
            for (run_name, run_scale), hogs in zip(((base_name, base_scale), (name, scale)), HOGS_BESIDE[load]):
                os.environ["FAKE_NEURON_KERNELS"] = kernels(run_scale)
                with mlflow.start_run(run_name=run_name) as run, cpu_hogs(hogs), \
                        busy_loader_workers(LOADER_WORKERS.get(load, 0)):
                    with MLflowProfilerCallback(run_id=run.info.run_id, strict=True, background=False) as callback:
                        with garbage_collector_paused():
                            profile_rmsnorm(spaced(callback, gap_s), steps=7 * cycles, activities=activities,
                                            wait=1, warmup=1, active=5, repeat=cycles)  # fmt: skip


def rotation_pair(cycles: int, load: str) -> None:
    """A/A in rotation: naive RMSNorm twice, as two variants of one `interleaved()` call (base,
    same, base, same, ...), each a child run of the pair's parent."""
    import mlflow
    from calibration import PeriodicHogs
    from calibration_runs import cpu_hogs
    from workloads import inputs, rms_norm_naive

    from mlflow_neuron import interleaved

    x, weight = inputs()
    load_beside = PeriodicHogs(2, 3.0) if load == "periodic" else cpu_hogs(ROTATION_HOGS[load])
    with load_beside, busy_loader_workers(LOADER_WORKERS.get(load, 0)), mlflow.start_run(run_name="pair"):
        interleaved({"base": lambda: rms_norm_naive(x, weight), "same": lambda: rms_norm_naive(x, weight)},
                    cycles=cycles, wait=1, warmup=1, active=5, device="cpu", strict=True, background=False)  # fmt: skip


ITEM_S = 0.02  # a batch's work in a busy DataLoader worker: Python arithmetic, as decoding and augmenting are


@contextmanager
def busy_loader_workers(count: int):
    """`count` DataLoader worker processes of this job, busy while the block runs: an endless
    dataset whose every item takes `ITEM_S`, and a thread of the job that takes the batches as
    they come, as a training loop's input pipeline works beside its steps."""
    if not count:
        yield
        return
    import threading

    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class SpinningItems(IterableDataset):  # the workers are forked: nothing of it is pickled
        def __iter__(self):
            while True:
                end = time.perf_counter() + ITEM_S
                while time.perf_counter() < end:
                    pass
                yield torch.zeros(4)

    batches = iter(DataLoader(SpinningItems(), batch_size=None, num_workers=count, prefetch_factor=2))
    stop = threading.Event()

    def take() -> None:
        while not stop.is_set():
            next(batches)

    taker = threading.Thread(target=take, name="loader", daemon=True)
    taker.start()
    time.sleep(0.5)  # the workers started and busy before the first profiled step
    try:
        yield
    finally:
        stop.set()
        taker.join(10)
        batches._shutdown_workers()  # ends them now, not when the iterator is collected


def spaced(callback, gap_s: float):
    """`callback`, then a pause of `gap_s`: the next cycle starts that much later."""
    if gap_s <= 0:
        return callback

    def handed(prof) -> None:
        callback(prof)
        time.sleep(gap_s)

    return handed


def experiment(kind: str, load: str, cycles: int, index: int) -> str:
    return f"{kind}-{load}-{cycles}-{index}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="pairs per cell and kind (default: %(default)s)")
    parser.add_argument("--loads", default=",".join(LOADS), help="comma-separated, of " + ", ".join(LOADS))
    parser.add_argument("--cycles", default="1,2,3,4", help="cycles a run, comma-separated (default: %(default)s)")
    parser.add_argument("--gap-s", type=float, default=0.0, help="seconds between a run's cycles (default: "
                        "%(default)s, back to back)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=2026, help="FAKE_NEURON_SEED for the fake device's noise")
    parser.add_argument("--busy-shares", default="", help="comma-separated --host-busy-share values to judge the "
                        "A/A pairs again with (default: none)")  # fmt: skip
    parser.add_argument("--rotation", action="store_true", help="also A/A pairs profiled in rotation "
                        "(interleaved()), under the loads that allow it (not `one`)")  # fmt: skip
    parser.add_argument("--store", default=None, help="judge the runs a former matrix logged in this store "
                        "(its --pairs, --loads and --cycles) instead of logging new ones")  # fmt: skip
    args = parser.parse_args()
    loads, cycles = args.loads.split(","), [int(c) for c in args.cycles.split(",")]
    if set(loads) - set(LOADS) or args.pairs < 1 or min(cycles) < 1 or not 0 <= args.gap_s <= 60:
        parser.error(f"--loads must be among {', '.join(LOADS)}; --pairs and --cycles at least 1; --gap-s 0 to 60")
    try:
        shares = [float(s) for s in args.busy_shares.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--busy-shares must be numbers, got {args.busy_shares!r}")

    import calibration_runs

    so = calibration_runs.fake_device_library("A/A on CPU only")
    kinds = ["aa", "ab"] if so else ["aa"]
    kinds += ["rot"] if args.rotation else []
    uri = args.store
    if uri is None:
        work = pathlib.Path(tempfile.mkdtemp(prefix="mlflow-neuron-matrix-"))
        plan = [(kind, load, n, i) for load in loads for n in cycles for kind in kinds for i in range(args.pairs)
                if kind != "rot" or load in ROTATION_HOGS]  # fmt: skip
        uri = f"sqlite:///{work / 'mlflow.db'}"
        started = time.perf_counter()
        calibration_runs.run_worker(work, f"import calibration_matrix; calibration_matrix.make_cells({uri!r}, "
                                    f"{so!r}, {plan!r}, {args.gap_s!r})", args.seed, (ROOT,))  # fmt: skip
        print(f"logged {2 * len(plan)} runs in {time.perf_counter() - started:.0f} s ({uri})\n")
    rotation = "rot" in kinds
    print("| load | cycles a run | A/A on CPU: gate fired | A/A: total's verdicts | A/B +30% on the fake device: found |"
          + (" A/A in rotation: gate fired | in rotation: total's verdicts |" if rotation else ""))  # fmt: skip
    print("|---|---|---|---|---|" + ("---|---|" if rotation else ""))
    for load in loads:
        for n in cycles:
            print(cell_row(uri, load, n, args.pairs, "ab" in kinds, rotation))
    if shares:
        print("\nthe A/A pairs on CPU judged again with --host-busy-share S: gate fired / host time judged "
              "(a verdict other than inconclusive)")  # fmt: skip
        print("| pairs | load | cycles a run | " + " | ".join(f"S = {s:g}" for s in shares) + " |")
        print("|---|---|---|" + "---|" * len(shares))
        for kind in ("aa", "rot") if rotation else ("aa",):
            for load in [load for load in loads if kind == "aa" or load in ROTATION_HOGS]:
                for n in cycles:
                    cells = []
                    for share in shares:
                        fired, verdicts = aa_cell(uri, load, n, args.pairs, share, kind)
                        judged = sum(v != "inconclusive" for v in verdicts)
                        cells.append(f"{fired} / {judged}")
                    pairs = "A/A in rotation" if kind == "rot" else "A/A"
                    print(f"| {pairs} | {load} | {n} | " + " | ".join(cells) + " |")
    return 0


def aa_cell(uri: str, load: str, cycles: int, pairs: int, share: float | None = None,
            kind: str = "aa") -> tuple[int, list[str]]:  # fmt: skip
    """The A/A pairs of one cell: how many the gate fired on, and each pair's total verdict."""
    import calibration_runs

    extra = () if share is None else ("--host-busy-share", str(share))
    fired, verdicts = 0, []
    for index in range(pairs):
        code, report = calibration_runs.gate(uri, experiment(kind, load, cycles, index), *extra)
        fired += code == 1
        verdicts.append(calibration_runs.total_verdict(report))
    return fired, verdicts


def cell_row(uri: str, load: str, cycles: int, pairs: int, with_device: bool, rotation: bool = False) -> str:
    """One cell: the A/A pairs' alarms and verdicts, the A/B pairs the gate found, and with
    `rotation` the A/A pairs in rotation."""
    import calibration_runs

    fired, verdicts = aa_cell(uri, load, cycles, pairs)
    found = "-"
    if with_device:
        found = sum(calibration_runs.gate(uri, experiment("ab", load, cycles, i))[0] == 1 for i in range(pairs))
        found = f"{found}/{pairs}"
    row = f"| {load} | {cycles} | {fired}/{pairs} | {_counted(verdicts)} | {found} |"
    if rotation and load in ROTATION_HOGS:
        fired, verdicts = aa_cell(uri, load, cycles, pairs, kind="rot")
        row += f" {fired}/{pairs} | {_counted(verdicts)} |"
    elif rotation:
        row += " - | - |"
    return row


def _counted(verdicts: list[str]) -> str:
    return ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts)))


if __name__ == "__main__":
    sys.exit(main())
