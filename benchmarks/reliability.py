"""What the training thread pays per profiler cycle with background sending vs inline, against a
real `mlflow server` behind a loopback proxy that adds latency to every request; then the fault
table (scenarios from tests/fault_scenarios.py). One run, side by side.

    python benchmarks/reliability.py [--cycles 5] [--delay-ms 50] [--no-faults]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(Path(__file__).resolve().parent)]

from cycle_cost import mlp_step  # noqa: E402
from fault_scenarios import SCENARIOS, client_env  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from servers import DelayProxy, MlflowServer  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from mlflow_neuron import MLflowNeuronWarning, MLflowProfilerCallback  # noqa: E402


def training_thread_ms(uri: str, background: bool, cycles: int) -> tuple[float, float]:
    """Median (whole callback call, reading the profiler results) in ms over `cycles` cycles."""
    run_id = MlflowClient(uri).create_run("0").info.run_id
    callback = MLflowProfilerCallback(run_id=run_id, tracking_uri=uri, background=background, flush_timeout_s=300)
    reads, calls = [], []
    original_read = callback._read_cycle

    def timed_read(*args):
        start = time.perf_counter()
        try:
            return original_read(*args)
        finally:
            reads.append(time.perf_counter() - start)

    callback._read_cycle = timed_read

    def timed_call(prof):
        start = time.perf_counter()
        callback(prof)
        calls.append(time.perf_counter() - start)

    step = mlp_step(8)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=cycles),
                 on_trace_ready=timed_call) as prof:
        for _ in range(4 * cycles):
            step()
            time.sleep(0.2)  # the rest of a training step: room for the sender to work
            prof.step()
    callback.close()
    assert callback.cycles_logged == cycles, "every cycle must arrive for the figures to mean anything"
    return statistics.median(calls) * 1000, statistics.median(reads) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, default=50)
    parser.add_argument("--no-faults", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix="mlflow-neuron-reliability-"))
    with client_env(), MlflowServer(work / "server") as server:
        server.start()
        with DelayProxy(server.port, delay_s=args.delay_ms / 1000) as proxy:
            proxy.start()
            client = MlflowClient(proxy.uri)
            start = time.perf_counter()
            for _ in range(5):
                client.get_experiment("0")
            request_ms = (time.perf_counter() - start) / 5 * 1000
            print(f"tracking server: {proxy.uri} -> {server.uri}, one request {request_ms:.0f} ms through the proxy")
            print(f"training-thread time per cycle (median of {args.cycles}, mlp 8 layers + sgd):")
            print(f"{'mode':<12}{'callback ms':>13}{'of which reading':>18}{'beyond reading':>16}")
            rows = {mode: training_thread_ms(proxy.uri, mode == "background", args.cycles)
                    for mode in ("background", "inline")}
            for mode, (call_ms, read_ms) in rows.items():
                print(f"{mode:<12}{call_ms:>13.1f}{read_ms:>18.1f}{call_ms - read_ms:>16.1f}")
            print(f"inline / background: {rows['inline'][0] / rows['background'][0]:.1f}x")
    if args.no_faults:
        return
    print("\nfault scenarios (real mlflow server; sync run twice afterwards):")
    print(f"{'scenario':<34}{'loop done':>10}{'cycles sent':>13}{'live':>6}{'outbox':>8}{'present after sync':>20}{'dup':>5}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MLflowNeuronWarning)
        for index, scenario in enumerate(SCENARIOS):
            o = scenario(work / f"fault_{index}")
            done = "yes" if o.steps_completed == 4 * o.cycles_sent else "NO"
            print(f"{o.scenario:<34}{done:>10}{o.cycles_sent:>13}{o.delivered_live:>6}{o.kept_in_outbox:>8}"
                  f"{o.present_after_sync:>20}{o.duplicated:>5}")


if __name__ == "__main__":
    main()
