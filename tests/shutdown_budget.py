"""The shutdown budget, measured in a fresh interpreter: a short profiled loop whose callback
sends to `uri`, then the profiler's exit, `close()` if asked, and interpreter exit.

The script prints when it reached each point: `loop_end`, `profiler_exited`, `closed` (with
close) and `last_atexit`, one `name seconds-since-epoch` a line; `helper_not_started` (and nothing
measured) when the helper process was asked for and did not start within 300 s. Used by tests/test_edges.py and
benchmarks/edges.py.
"""

from __future__ import annotations

_SCRIPT = """
import atexit, time, warnings
atexit.register(lambda: print("last_atexit", time.time(), flush=True))  # registered first: runs last
from torch.profiler import ProfilerActivity, profile, schedule
from mlflow_neuron import MLflowProfilerCallback
from workloads import inputs, rms_norm_naive
warnings.simplefilter("ignore")
budget = {} if BUDGET is None else {"flush_timeout_s": BUDGET}
# With the helper, a run id (the hung server checks nothing): cycles of a run yet to be created
# are processed in-process, so that only one process creates it.
run = {"run_id": "0123456789abcdef0123456789abcdef"} if HELPER else {"experiment_id": "0"}
callback = MLflowProfilerCallback(tracking_uri=URI, outbox=OUTBOX, **run, **budget)
if HELPER and not callback.start_helper(300):  # every cycle through the helper process
    print("helper_not_started", time.time(), flush=True)  # the caller decides: no helper path to measure
    raise SystemExit(0)
x, w = inputs()
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=callback) as prof:
    for _ in range(8):
        rms_norm_naive(x, w)
        prof.step()
    print("loop_end", time.time(), flush=True)
print("profiler_exited", time.time(), flush=True)
if CLOSE:
    callback.close()
    print("closed", time.time(), flush=True)
"""


def budget_script(uri: str, outbox: str, close: bool, flush_timeout_s: float | None = None,
                  helper: bool = False) -> str:  # fmt: skip
    """The code for `python -c` (with the repository and tests/ on PYTHONPATH); `flush_timeout_s`
    None keeps the callback's default; `helper` starts the helper process before the loop."""
    values = {"URI": uri, "OUTBOX": outbox, "CLOSE": close, "BUDGET": flush_timeout_s, "HELPER": helper}
    return "".join(f"{name} = {value!r}\n" for name, value in values.items()) + _SCRIPT


def moments(stdout: str) -> dict[str, float]:
    """The script's output as {point: time}."""
    return {name: float(value) for name, value in (line.split() for line in stdout.splitlines())}
