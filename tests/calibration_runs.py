"""Real profiled runs for calibrating comparisons: pairs of runs logged through
`MLflowProfilerCallback`, each pair in its own experiment, compared as a user would with
`mlflow-neuron compare --experiment E --baseline base --fail-if-slower 10`.

Used by tests/test_calibration.py and benchmarks/calibration.py. Every run is profiled with
`schedule(wait=1, warmup=1, active=5, repeat=4)`: 20 per-step samples in 4 cycles, enough for the
comparison to check the cycles against each other. The workload is the naive RMSNorm of the
example: per step 3 x aten::mul, aten::mean, aten::add, aten::rsqrt, each given one fake kernel
by the fake PrivateUse1 profiler (tests/fake_device), with seeded noise.

Kind `cpu-aa-load` (benchmarks only: it loads the machine) profiles the candidate of a CPU A/A
pair while `HOGS` processes spin on the CPU beside it. Kind `cpu-rot` profiles a CPU A/A pair in
rotation (`interleaved`: base, same, base, ...) with `ROTATION_CYCLES` cycles a run, as many as
the gate needs to act on host time (an interval over cycles, runs that shared their weather).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import time
from contextlib import contextmanager, redirect_stdout

KERNELS = {"aten::mul": 100, "aten::mean": 40, "aten::add": 20, "aten::rsqrt": 30}
NOISE = {"FAKE_NEURON_JITTER": "0.3", "FAKE_NEURON_STALL_RATE": "0.02", "FAKE_NEURON_STALL_FACTOR": "10"}
SCHEDULE = dict(wait=1, warmup=1, active=5, repeat=4)
STEPS = (SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]) * SCHEDULE["repeat"]
HOGS = 2
ROTATION_CYCLES = 6  # the gate's family-wise interval over cycles needs 5 a run


def kernels(scale: float) -> str:
    return ",".join(f"{op}={round(us * scale)}" for op, us in KERNELS.items())


def make_runs(uri: str, pairs: int, cpu_pairs: int, so: str | None, load_pairs: int = 0, rotation_pairs: int = 0) -> None:
    """Worker: logs the runs of every pair (one process, so the fake device is activated once)."""
    import mlflow
    import torch
    from rmsnorm_variants import garbage_collector_paused  # examples/rmsnorm_variants.py
    from torch.profiler import ProfilerActivity
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    torch.set_num_threads(1)  # as the example does: no OpenMP workers waiting for a core
    mlflow.set_tracking_uri(uri)
    plan = [("cpu-aa", i, ("base", 1.0), ("same", 1.0)) for i in range(cpu_pairs)]
    plan += [("cpu-aa-load", i, ("base", 1.0), ("same", 1.0)) for i in range(load_pairs)]
    if so is not None:
        import fake_device

        fake_device.activate(pathlib.Path(so))
        plan += [("aa", i, ("base", 1.0), ("same", 1.0)) for i in range(pairs)]
        plan += [("ab", i, ("base", 1.0), ("slower", 1.3)) for i in range(pairs)]
    for index in range(rotation_pairs):
        rotation_pair(f"cpu-rot-{index}")
    for kind, index, *runs in plan:
        mlflow.set_experiment(f"{kind}-{index}")
        for name, scale in runs:
            os.environ["FAKE_NEURON_KERNELS"] = kernels(scale)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if not kind.startswith("cpu") else [])
            loaded = kind == "cpu-aa-load" and name == "same"
            with mlflow.start_run(run_name=name) as run, cpu_hogs(HOGS if loaded else 0):
                # background=False: each cycle is sent between profiled windows, so no work of ours
                # runs while a step is recorded (host time would carry it, through the GIL)
                with MLflowProfilerCallback(run_id=run.info.run_id, strict=True, background=False) as callback:
                    with garbage_collector_paused():
                        profile_rmsnorm(callback, steps=STEPS, activities=activities, **SCHEDULE)


def rotation_pair(experiment: str) -> None:
    """A CPU A/A pair in rotation: naive RMSNorm twice, as the two variants of one `interleaved()`
    call, each a child run of the pair's parent."""
    import mlflow
    from workloads import inputs, rms_norm_naive

    from mlflow_neuron import interleaved

    x, weight = inputs()
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name="pair"):
        interleaved({"base": lambda: rms_norm_naive(x, weight), "same": lambda: rms_norm_naive(x, weight)},
                    cycles=ROTATION_CYCLES, wait=SCHEDULE["wait"], warmup=SCHEDULE["warmup"], active=SCHEDULE["active"],
                    device="cpu", strict=True, background=False)  # fmt: skip


SPIN = "while True: pass"


def unrelated_process(code: str) -> "psutil.Process":
    """`python -c code`, started outside this process's tree (the process that starts it exits at
    once): the host sample counts its CPU as the host's load, where a child of the profiled process
    would be the job's own (`_capture.child_processes`). A hog beside a job is another user's work."""
    import psutil

    starter = (f"import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', {code!r}], "
               "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True).pid)")  # fmt: skip
    started = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True, timeout=120)
    return psutil.Process(int(started.stdout))


def end_unrelated(process: "psutil.Process", timeout_s: float = 10.0) -> None:
    """Kills it by pid and waits until it is gone or a zombie (its parent now is init, which reaps it)."""
    import psutil

    try:
        process.kill()
        deadline = time.monotonic() + timeout_s
        while process.is_running() and process.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
    except psutil.NoSuchProcess:
        pass


@contextmanager
def cpu_hogs(count: int):
    """`count` processes outside this one's tree that spin on the CPU while the block runs; ended by
    pid, whatever happens."""
    hogs = [unrelated_process(SPIN) for _ in range(count)]
    try:
        if hogs:
            time.sleep(0.5)  # let them reach the scheduler before the first profiled step
        yield hogs
    finally:
        for hog in hogs:
            end_unrelated(hog)


def gate(uri: str, experiment: str, *extra: str) -> tuple[int, str]:
    from mlflow_neuron.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["compare", "--experiment", experiment, "--baseline", "base", "--fail-if-slower", "10",
                     "--format", "json", "--tracking-uri", uri, *extra])  # fmt: skip
    return code, out.getvalue()


def document(report: str) -> dict:
    """The JSON document of `gate`'s output (the gate's lines follow it)."""
    return json.loads(report[: report.rindex("}") + 1])


def total_verdict(report: str) -> str:
    parsed = document(report)
    total = next(row for row in parsed["rows"] if row["op"] == "TOTAL")
    run = next(label for label in parsed["runs"] if label != "base")
    return total[f"{run}/verdict"]


def log_pairs(work: pathlib.Path, so: str | None, pairs: int, cpu_pairs: int, seed: int = 2026,
              load_pairs: int = 0, rotation_pairs: int = 0) -> str:  # fmt: skip
    """Logs every pair's runs into a sqlite store under `work` (in one subprocess, where the fake
    device is activated once); returns the store's URI."""
    uri = f"sqlite:///{work / 'mlflow.db'}"
    code = (f"import calibration_runs; calibration_runs.make_runs({uri!r}, {pairs}, {cpu_pairs}, "
            f"{so if so is None else repr(so)}, {load_pairs}, {rotation_pairs})")  # fmt: skip
    run_worker(work, code, seed)
    return uri


def fake_device_library(without: str) -> str | None:
    """The fake PrivateUse1 profiler's library, built once per user in the temp folder; None where it
    cannot be built, after saying why and what runs `without` it."""
    import tempfile

    import fake_device

    try:
        return str(fake_device.build(pathlib.Path(tempfile.gettempdir()) / f"fake_neuron_build_{os.getuid()}"))
    except fake_device.FakeDeviceUnavailable as reason:
        print(f"fake device unavailable ({reason}); {without}")
        return None


def run_worker(work: pathlib.Path, code: str, seed: int, extra_path: tuple[pathlib.Path, ...] = ()) -> None:
    """Runs `code` in a fresh interpreter in `work`, with the fake device's noise (seeded), tests/,
    examples/ and `extra_path` importable; raises CalledProcessError with its output when it fails."""
    here = pathlib.Path(__file__).resolve().parent
    paths = [str(here.parent), str(here), str(here.parent / "examples"), *map(str, extra_path)]
    env = {**os.environ, **NOISE, "FAKE_NEURON_SEED": str(seed), "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=work, env=env, capture_output=True, text=True)


def rates(uri: str, kind: str, pairs: int) -> tuple[int, int]:
    """(pairs whose gate fired, pairs whose TOTAL verdict was `no change`) for one kind of pair."""
    fired, verdicts = gate_and_verdicts(uri, kind, pairs)
    return fired, verdicts.count("no change")


def gate_and_verdicts(uri: str, kind: str, pairs: int) -> tuple[int, list[str]]:
    """(pairs whose gate fired, each pair's TOTAL verdict) for one kind of pair."""
    fired, verdicts = 0, []
    for index in range(pairs):
        code, report = gate(uri, f"{kind}-{index}")
        fired += code == 1
        verdicts.append(total_verdict(report))
    return fired, verdicts
