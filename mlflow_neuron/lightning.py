"""Lightning: profile training steps into the run that Lightning's `MLFlowLogger` logs to.

Example::

    import lightning as L
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow_neuron.lightning import ProfilerCallback

    logger = MLFlowLogger(experiment_name="train", tracking_uri="http://127.0.0.1:5000")
    trainer = L.Trainer(logger=logger, max_steps=100, callbacks=[ProfilerCallback(wait=1, warmup=1, active=3)])
    trainer.fit(model, dataloader)      # one run: Lightning's metrics and params, and profiler/...

Needs Lightning (``pip install "mlflow-neuron[lightning]"``); ``import mlflow_neuron`` alone never
imports it.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.profilers import PyTorchProfiler
except ImportError as error:
    raise ImportError(
        'mlflow_neuron.lightning needs Lightning (the `lightning` package): pip install "mlflow-neuron[lightning]"'
    ) from error

from ._capture.scheduled import ProfiledTraining

__all__ = ["ProfilerCallback"]


class ProfilerCallback(ProfiledTraining, Callback):
    """Runs ``torch.profiler`` over training batches and logs each cycle into Lightning's MLflow run.

    The run is the one of the first ``MLFlowLogger`` in ``trainer.loggers`` (its ``run_id`` and
    tracking URI), so one run holds Lightning's metrics and params and the ``profiler/...``
    metrics and artifacts of `MLflowProfilerCallback`. Without an ``MLFlowLogger`` the profile
    goes to the active MLflow run, else ``MLFLOW_RUN_ID``'s, else a new run that ends with training.

    A profiler step is one training batch (``on_train_batch_end``); the device is synchronized
    before each step so device time lands in it. The schedule starts at the first training batch:
    ``skip_first`` batches, then ``repeat`` cycles of ``wait`` + ``warmup`` + ``active`` batches.
    Once the last cycle is logged the profiler stops, so the rest of training runs unprofiled.
    Cycles are logged at ``step = prof.step_num``, the number of batches since profiling began.

    Every rank profiles, into the one run of the job (rank 0's logger's run): rank 0 logs the
    metrics and tables, every rank its rank summary (``profiler/ranks/rank_<r>/``). Errors are reported as one ``MLflowNeuronWarning`` each and never
    stop training (``strict=True`` or ``MLFLOW_NEURON_STRICT=1`` re-raises them). Not together with
    Lightning's own ``Trainer(profiler="pytorch")``: torch runs one profiler at a time.

    Args:
        wait, warmup, active, repeat, skip_first: the ``torch.profiler.schedule``; ``repeat=0``
            profiles cycles until training ends.
        device: ``"neuron"``, ``"cuda"``, ``"cpu"``; default: the LightningModule's device type.
        profile_output_dir: where the Neuron profiler writes (default ``./neuron_profile``).
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.
        handlers: more ``on_trace_ready`` handlers (``tensorboard_trace_handler(dir)``), called
            after the Neuron exporter and before logging.
        run_id, tracking_uri: log into this run instead of the ``MLFlowLogger``'s.
        **options: passed to `MLflowProfilerCallback` (``top_k``, ``max_file_bytes``, ``strict``, ...).
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and isinstance(trainer.profiler, PyTorchProfiler):
            raise ValueError(
                "mlflow_neuron.lightning.ProfilerCallback cannot run next to Trainer(profiler=PyTorchProfiler): "
                "torch runs one profiler at a time; drop one of them"
            )

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.profiler.waiting_to_start:
            self.profiler.start(pl_module.device.type, lambda: _mlflow_run_of(trainer))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.profiler.step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.profiler.reset()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.profiler.reset()


def _mlflow_run_of(trainer: Any) -> tuple[str | None, str | None]:
    """The first MLFlowLogger's (run id, tracking URI); (None, None) without one."""
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger):
            # `run_id` creates Lightning's run if it does not exist yet; Lightning keeps the URI private.
            return logger.run_id, getattr(logger, "_tracking_uri", None)
    return None, None
