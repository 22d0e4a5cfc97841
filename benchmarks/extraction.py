"""Training-thread cost of reading one profiler cycle: the fast path (`_kineto` + `_aggregate`) against
torch's own parse, on cycles of N CPU ops each launching one fake "neuron" device kernel.

    python benchmarks/extraction.py [--quick] [--reps 5]     # ~2 min on 2 cores; --quick ~1 min

Each reader gets fresh cycles (torch caches its parse), medians over --reps cycles:

  (a) fast path:   raw_events_from_kineto(prof) + aggregate(...)
  (b) torch parse: prof.events() + extract_cycle(...)
  (c) torch table: prof.events() + key_averages()       ((b) and (c) share one timed prof.events())
  (d) floor:       a bare Python loop reading, from every raw Kineto event, the fields (a) reads

Then peak RSS of a 100k-op cycle, profiler alone vs profiler + fast path (and + prof.events() for
scale), each in a fresh interpreter; then benchmarks/cycle_cost.py's table (the whole callback vs
export_chrome_trace, MLflow client calls per cycle, trace bytes uploaded vs raw). The fake device is a Kineto PrivateUse1 profiler compiled
from tests/fake_device (needs g++); without it the cycles are CPU ops only (a note says so).
No timed assertions: this prints a table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("FAKE_NEURON_KERNELS", "aten::add=1")
os.environ.setdefault("FAKE_NEURON_MODE", "kernels")


def activate_fake_device() -> str | None:
    """Loads the fake neuron profiler into this process; returns why not, or None."""
    import fake_device

    try:
        so = fake_device.build(pathlib.Path(tempfile.gettempdir()) / f"fake_neuron_build_{os.getuid()}")
        fake_device.activate(so)
    except fake_device.FakeDeviceUnavailable as reason:
        return str(reason).splitlines()[0]
    return None


def profile_cycle(ops: int, with_device: bool):
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if with_device else [])
    a, b = torch.ones(4), torch.ones(4)
    with profile(activities=activities) as prof:
        for _ in range(ops):
            torch.add(a, b)
    return prof


def fast_path(prof, device):
    from mlflow_neuron._trace.aggregate import aggregate
    from mlflow_neuron._trace.kineto import raw_events_from_kineto

    raw = raw_events_from_kineto(prof)
    assert raw is not None, "the fast path declined this profile"
    return aggregate(raw, device=device, device_profiled=device != "cpu")


def torch_parse(prof, device):
    from mlflow_neuron._trace.function_events import extract_cycle

    return extract_cycle(prof.events(), device=device, device_profiled=device != "cpu")


def bare_loop(prof, device):
    """Only the reads the fast path makes (host events: threads, id, async flag; device events:
    the annotation flag), one event at a time: the cost floor of any Python-side reader."""
    from torch.autograd import DeviceType

    result = prof.profiler.kineto_results
    result.trace_start_ns()
    cpu, rows = DeviceType.CPU, []
    for e in result.events():
        common = (e.name(), e.is_hidden_event(), e.device_type(), e.start_ns(), e.end_ns(), e.linked_correlation_id())
        if common[2] == cpu:
            rows.append((common, e.start_thread_id(), e.end_thread_id(), e.is_async(), e.correlation_id()))
        else:
            rows.append((common, e.is_user_annotation()))
    return rows


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def measure(ops: int, reps: int, device: str) -> tuple[dict[str, float], int]:
    """Medians over `reps` fresh cycles per reader. (b) and (c) share a cycle: both pay torch's
    parse (`prof.events()`, timed once), then extract_cycle or key_averages() (timed apart)."""
    from mlflow_neuron._trace.function_events import extract_cycle

    seconds: dict[str, list[float]] = {key: [] for key in "abcd"}
    for rep in range(reps):
        for key in ("a", "d", "bc") if rep % 2 == 0 else ("bc", "d", "a"):
            prof = profile_cycle(ops, device != "cpu")
            if key == "a":
                seconds["a"].append(timed(fast_path, prof, device)[0])
            elif key == "d":
                seconds["d"].append(timed(bare_loop, prof, device)[0])
            else:
                parse, events = timed(prof.events)
                extract, _ = timed(extract_cycle, events, device=device, device_profiled=device != "cpu")
                table, _ = timed(events.key_averages)
                seconds["b"].append(parse + extract)
                seconds["c"].append(parse + table)
            count = len(prof.profiler.kineto_results.events())
            del prof
    return {key: statistics.median(values) for key, values in seconds.items()}, count


def check_agreement(ops: int, device: str) -> str:
    """The fast path and torch's parse agree on the benchmark cycle (sanity, not timed)."""
    prof = profile_cycle(ops, device != "cpu")
    fast, slow = fast_path(prof, device), torch_parse(prof, device)
    return "identical" if fast == slow else "DIFFERENT (see tests/test_raw.py)"


def _status_mib(field: str) -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_child(mode: str, ops: int) -> None:
    """Prints: whole-process peak, RSS held after the profile, peak while reading it (MiB)."""
    import mlflow_neuron._trace.aggregate  # noqa: F401 - loaded in every child: the callback has them loaded anyway
    import mlflow_neuron._trace.kineto  # noqa: F401

    note = activate_fake_device()
    device = "cpu" if note else "neuron"
    prof = profile_cycle(ops, device != "cpu")
    held = _status_mib("VmRSS")
    # VmHWM, not ru_maxrss: after fork+exec, ru_maxrss still counts the parent's pre-exec peak.
    profiling_peak = _status_mib("VmHWM")
    try:  # resets VmHWM, so the next peak is the reading phase's own (Linux >= 4.0)
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    if mode == "fast":
        fast_path(prof, device)
    elif mode == "events":
        prof.events().key_averages()
    phase = _status_mib("VmHWM") if reset else float("nan")
    print(f"RSS {max(profiling_peak, phase)} {held} {phase}")


def peak_rss_mib(mode: str, ops: int) -> tuple[float, float, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", mode, "--ops", str(ops)],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    [line] = [line for line in out.splitlines() if line.startswith("RSS ")]
    peak, held, phase = (float(v) for v in line.split()[1:])
    return peak, held, phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repetition at 100k ops, three at 10k")
    parser.add_argument("--reps", type=int, default=5, help="cycles per reader and size (default 5)")
    parser.add_argument("--rss-child", choices=("profiler", "fast", "events"), help=argparse.SUPPRESS)
    parser.add_argument("--ops", type=int, default=100_000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.ops)
        return

    import torch

    note = activate_fake_device()
    device = "cpu" if note else "neuron"
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    if note:
        print(f"NOTE: fake device unavailable ({note}); cycles are CPU ops only, no device kernels.")
    else:
        print("cycles: N x torch.add on CPU, each launching one fake neuron kernel (2N raw events)")
    profile_cycle(1000, device != "cpu")  # warm-up: first-use costs stay out of the table
    print(f"fast path vs prof.events() on a 10k-op cycle: {check_agreement(10_000, device)}\n")

    header = (f"{'ops/cycle':>10}{'events':>9}{'(a) fast':>10}{'(b) ev+extract':>16}{'(c) ev+key_avg':>16}"
              f"{'(d) bare loop':>15}{'b/a':>7}{'c/a':>7}{'a/d':>7}")  # fmt: skip
    print(header)
    for ops, reps in ((10_000, 3 if args.quick else args.reps), (100_000, 1 if args.quick else args.reps)):
        t, events = measure(ops, reps, device)
        print(f"{ops:>10,}{events:>9,}{t['a']:>9.3f}s{t['b']:>15.3f}s{t['c']:>15.3f}s{t['d']:>14.3f}s"
              f"{t['b'] / t['a']:>7.1f}{t['c'] / t['a']:>7.1f}{t['a'] / t['d']:>7.2f}", flush=True)  # fmt: skip
    print("medians; (a) fast path, (b) prof.events()+extract_cycle, (c) prof.events()+key_averages(), "
          "(d) bare read loop\n")  # fmt: skip

    print("peak RSS, 100k-op cycle, a fresh interpreter each (MiB):")
    print(f"{'':<28}{'process peak':>14}{'held after stop':>17}{'peak while reading':>20}")
    alone = None
    for label, mode in (("profiler alone", "profiler"), ("+ fast path", "fast"),
                        ("+ prof.events()+key_avg", "events")):  # fmt: skip
        peak, held, phase = peak_rss_mib(mode, 100_000)
        alone = alone or peak
        reading = "-" if mode == "profiler" else f"{phase:.0f} (+{phase - held:.0f})"
        print(f"  {label:<26}{peak:>8.0f} {peak / alone:4.2f}x{held:>17.0f}{reading:>20}")

    # Items 2-4 of the issue in the same run: the whole callback on the training thread against
    # the profiler's own export, MLflow client calls per cycle, and trace bytes uploaded vs raw.
    print("\nwhole callback invocation (training thread) vs export_chrome_trace, requests and bytes:")
    sys.path.insert(0, str(Path(__file__).parent))
    import cycle_cost

    cycle_cost.main(["--cycles", "3" if args.quick else "5"])

if __name__ == "__main__":
    main()
