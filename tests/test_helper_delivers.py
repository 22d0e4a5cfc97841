"""The helper delivers while training runs: a cycle is in MLflow before the profile stops.

The training process also sends at a profile's stop and at `close()`; a helper that delivered
nothing until then would still pass every end-of-script test. Here the loop keeps stepping after
its only cycle, and reads MLflow between steps: the cycle must arrive while the profile still
records, with no stop, flush or close to send it.
"""

import time

from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity, profile, schedule
from workloads import inputs, rms_norm_naive

from mlflow_neuron import MLflowProfilerCallback

ARRIVAL_S = 300.0  # the helper runs at nice 10 and imports MLflow first: minutes on a busy machine


def cycle_in_mlflow(client: MlflowClient, run_id: str, step: int) -> bool:
    return any(m.step == step for m in client.get_metric_history(run_id, "profiler/total/active_steps"))


def test_the_helper_delivers_a_cycle_while_the_loop_still_runs(tracking_uri):
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
        # Still inside the profile: nothing but the helper can have sent it.
        assert arrived_at_step is not None, f"cycle 4 not in MLflow after {step} steps ({ARRIVAL_S:.0f} s) of training"
    callback.close()
    assert [m.step for m in client.get_metric_history(callback.run_id, "profiler/total/active_steps")] == [4]
