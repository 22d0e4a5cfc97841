"""Hugging Face Transformers: profile `Trainer` steps into the run that its `MLflowCallback` logs to.

Example::

    from transformers import Trainer, TrainingArguments
    from mlflow_neuron.transformers import ProfilerCallback

    args = TrainingArguments("out", report_to=["mlflow"], max_steps=100, logging_steps=10)
    trainer = Trainer(model, args, train_dataset=data, callbacks=[ProfilerCallback(wait=1, warmup=1, active=3)])
    trainer.train()     # one run: the Trainer's metrics and params, and profiler/...

Needs Transformers (``pip install "mlflow-neuron[transformers]"``); ``import mlflow_neuron`` alone
never imports it.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as error:
    raise ImportError(
        'mlflow_neuron.transformers needs Hugging Face Transformers: pip install "mlflow-neuron[transformers]"'
    ) from error

import mlflow
from ._capture.scheduled import ProfiledTraining

__all__ = ["ProfilerCallback"]


class ProfilerCallback(ProfiledTraining, TrainerCallback):
    """Runs ``torch.profiler`` over ``Trainer`` steps and logs each cycle into the Trainer's MLflow run.

    ``MLflowCallback`` (``report_to=["mlflow"]``) logs through MLflow's fluent API, so its run is
    the run active on the training thread. That run is looked up when the first step begins, after
    every callback's ``on_train_begin``, so the order of the callbacks does not matter. One run then
    holds the Trainer's metrics and params and the ``profiler/...`` metrics and artifacts of
    `MLflowProfilerCallback`. Without an active run the profile goes to ``MLFLOW_RUN_ID``'s run,
    else a new run that ends with training.

    A profiler step is one optimizer step (``on_step_end``, after gradient accumulation); the
    device is synchronized before each step so device time lands in it. The schedule starts at the
    first step: ``skip_first`` steps, then ``repeat`` cycles of ``wait`` + ``warmup`` + ``active``
    steps. Once the last cycle is logged the profiler stops, so the rest of training runs
    unprofiled. Cycles are logged at ``step = prof.step_num``, the number of steps since profiling
    began: the Trainer's ``global_step``, unless training resumed from a checkpoint.

    Every process profiles, into the one run of the job (the world process zero's run): process
    zero logs the metrics and tables, every rank its rank summary (``profiler/ranks/rank_<r>/``). Errors are reported as one ``MLflowNeuronWarning`` each
    and never stop training (``strict=True`` or ``MLFLOW_NEURON_STRICT=1`` re-raises them).

    Args:
        wait, warmup, active, repeat, skip_first: the ``torch.profiler.schedule``; ``repeat=0``
            profiles cycles until training ends.
        device: ``"neuron"``, ``"cuda"``, ``"cpu"``; default: ``TrainingArguments.device``'s type.
        profile_output_dir: where the Neuron profiler writes (default ``./neuron_profile``).
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.
        handlers: more ``on_trace_ready`` handlers (``tensorboard_trace_handler(dir)``), called
            after the Neuron exporter and before logging.
        run_id, tracking_uri: log into this run instead of the active one.
        **options: passed to `MLflowProfilerCallback` (``top_k``, ``max_file_bytes``, ``strict``, ...).
    """

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler.waiting_to_start:
            self.profiler.start(args.device.type, _active_mlflow_run)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.profiler.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.profiler.reset()


def _active_mlflow_run() -> tuple[str | None, str | None]:
    """MLflowCallback's (run id, tracking URI): it logs through the fluent API, into the active run."""
    run = mlflow.active_run()
    return (run.info.run_id, mlflow.get_tracking_uri()) if run else (None, None)
