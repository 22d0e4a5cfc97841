"""The helper delivers while training runs: a cycle is in MLflow before the profile stops, and
the helper process is the one that sent it.

The training process also sends at a profile's stop and at `close()`, and drains by itself in a
thread when no helper runs (none could start, or its failure limit is spent): a loop that only
looked for the cycle in MLflow would pass with no helper at all. Here the helper is the product's
own (`helper.main`), with one addition: as it begins to send a cycle it writes its pid and the
cycle's step into a file. The loop keeps stepping after its only cycle and reads MLflow between
steps: the cycle must arrive while the profile still records, with no stop, flush or close to send
it, and the helper's own record, read then, must say that the helper process sent it.
"""

import os
import sys
import time

from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity, profile, schedule
from workloads import inputs, rms_norm_naive

from mlflow_neuron import MLflowProfilerCallback
from mlflow_neuron._delivery import helper_process as _helper_process

ARRIVAL_S = 300.0  # the helper runs at nice 10 and imports MLflow first: minutes on a busy machine

# The real helper; each send it makes is written down (pid, step) as it begins, so that the record
# is there by the time MLflow shows the cycle.
RECORDS_ITS_DELIVERIES = """
import os, sys
from mlflow_neuron._delivery import drain as _drain, helper as _helper
deliver = _drain.Drain._deliver
def recorded(self, ready, *args, **kwargs):
    with open({path!r}, "a", encoding="ascii") as out:
        out.writelines(f"{{os.getpid()}} {{item.delivery.step}}\\n" for item in ready)
    return deliver(self, ready, *args, **kwargs)
_drain.Drain._deliver = recorded
sys.exit(_helper.main())
"""


def cycle_in_mlflow(client: MlflowClient, run_id: str, step: int) -> bool:
    return any(m.step == step for m in client.get_metric_history(run_id, "profiler/total/active_steps"))


def delivered_by(record) -> list[tuple[int, int]]:
    """(pid, step) of each send the helper wrote down."""
    if not record.exists():
        return []
    return [tuple(int(word) for word in line.split()) for line in record.read_text(encoding="ascii").splitlines()]


def test_the_helper_delivers_a_cycle_while_the_loop_still_runs(tracking_uri, tmp_path, monkeypatch):
    record = tmp_path / "helper-deliveries.txt"
    monkeypatch.setattr(_helper_process, "HELPER_COMMAND",
                        (sys.executable, "-c", RECORDS_ITS_DELIVERIES.format(path=str(record))))  # fmt: skip
    callback = MLflowProfilerCallback(run_name="live")
    client = MlflowClient(tracking_uri)
    x, weight = inputs()
    arrived_at_step = None
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=callback,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:  # fmt: skip
        deadline = time.monotonic() + ARRIVAL_S
        step = 0
        while time.monotonic() < deadline:
            rms_norm_naive(x, weight)
            prof.step()
            step += 1
            if step > 4 and callback.cycles_read == 1 and cycle_in_mlflow(client, callback.run_id, 4):
                arrived_at_step = step
                break
            if step > 4:
                time.sleep(0.05)  # a training step after the profiled ones: nothing more is recorded
        # Still inside the profile, the helper still running: who sent it is on record now.
        assert arrived_at_step is not None, f"cycle 4 not in MLflow after {step} steps ({ARRIVAL_S:.0f} s) of training"
        helper_pid = callback._producer.helper.helper_pid  # what the helper said in its "ready" line
        deliveries = delivered_by(record)
    assert helper_pid is not None and helper_pid != os.getpid(), f"no helper process said it was ready ({helper_pid})"
    assert set(deliveries) == {(helper_pid, 4)}, (  # a retried send writes its line again
        f"cycle 4 reached MLflow during training, but the helper (pid {helper_pid}) recorded the sends "
        f"{deliveries}: the training process (pid {os.getpid()}) sent it"
    )
    callback.close()
    assert [m.step for m in client.get_metric_history(callback.run_id, "profiler/total/active_steps")] == [4]
