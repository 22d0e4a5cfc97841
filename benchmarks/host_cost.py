"""What sampling the host costs the training thread, per profiled window.

    python benchmarks/host_cost.py [--windows 2000] [--helper] [--children 3] [--threads 8]

Times `HostSampler.begin()` and `end()` (the two samples of one window, both on the training
thread), the CPU frequency read at every end, and, on their own, the sources they read. With `--helper` the sampler also reads a
stand-in helper process's CPU time, as the callback does while its helper runs. With
`--children N`, N idle child processes (each with a child of its own, as a compile worker
pool's) hang under this process, and `--threads T` threads wait in it; the window is timed with
the job's child processes read (`child_processes`: a file per thread of every process in the
tree) and, in the same run, without, side by side. Medians in microseconds; the cost grows with
the host's CPU count (/proc/stat has a line per CPU) and with the threads in the tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import torch  # noqa: E402

from mlflow_neuron._capture import child_processes, host  # noqa: E402
from mlflow_neuron._delivery.report import Reporter  # noqa: E402


def median_us(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--helper", action="store_true", help="also read a stand-in helper's CPU time")
    parser.add_argument("--children", type=int, default=0, help="idle child processes, each with one of its own")
    parser.add_argument("--threads", type=int, default=0, help="idle threads in this process")
    args = parser.parse_args()
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) if args.helper else None
    sleeper = "import time; time.sleep(600)"
    pool = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {sleeper!r}]); time.sleep(600)"
    children = [subprocess.Popen([sys.executable, "-c", pool]) for _ in range(args.children)]
    stop = threading.Event()
    for _ in range(args.threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    time.sleep(1.0 if children else 0.0)  # the grandchildren started
    try:
        pids = (lambda: [helper.pid]) if helper else tuple
        sampler = host.HostSampler(Reporter(strict=True), torch_threads=torch.get_num_threads, helper_pids=pids)
        host.FREQUENCY_REFRESH_S = 0.0  # the frequency read at every end, as on a host where it is fast
        print(f"{os.cpu_count()} CPUs, psutil {psutil.__version__}, helper read: {bool(helper)}, "
              f"{args.children} children with a child each, {threading.active_count()} threads here")
        for read_children in (True, False):
            sampler._children = read_children and child_processes.supported()
            begin = median_us(sampler.begin, args.windows)
            end = median_us(sampler.end, args.windows)
            print(f"child processes read: {sampler._children}: begin {begin:.1f} us, end {end:.1f} us, "
                  f"one window {begin + end:.1f} us (median of {args.windows})")
        for name, source in (("psutil.cpu_times", psutil.cpu_times), ("os.times", os.times),
                             ("os.getloadavg", os.getloadavg), ("psutil.cpu_freq", psutil.cpu_freq),
                             ("descendants_cpu_seconds", child_processes.descendants_cpu_seconds)):  # fmt: skip
            print(f"  {name}: {median_us(source, args.windows):.1f} us")
    finally:
        stop.set()
        for process in [*children, *([helper] if helper else [])]:
            process.kill()  # the children's own children end with their 600 s sleep
            process.wait()


if __name__ == "__main__":
    main()
