"""Lightning: a tiny real model trained a few steps on CPU, profiled into MLFlowLogger's run."""

from __future__ import annotations

import socket
import warnings

import mlflow
import pytest
import torch
from conftest import artifact_files, import_error_without, run_python
from mlflow.tracking import MlflowClient

from mlflow_neuron import MLflowNeuronWarning
from mlflow_neuron._record.model import node_file

L = pytest.importorskip("lightning", reason='Lightning is not installed (pip install "mlflow-neuron[lightning]")')
from lightning.pytorch.loggers import MLFlowLogger  # noqa: E402

from mlflow_neuron.lightning import ProfilerCallback  # noqa: E402

# region_ops.json: Lightning wraps its hooks in record_function ranges, which are regions
CYCLE_FILES = {"ops.json", "steps.json", "step_totals.json", "timeline.json", "key_averages.txt", "manifest.json",
               "trace.json.gz", "region_ops.json"}


class TinyRegression(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def batches(n: int = 96, batch_size: int = 8):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
    return torch.utils.data.DataLoader(data, batch_size=batch_size)


def fit(tmp_path, callback, *, logger, max_steps: int, **trainer_kwargs):
    trainer = L.Trainer(
        max_steps=max_steps, logger=logger, callbacks=[callback], accelerator="cpu", devices=1,
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, **trainer_kwargs,
    )  # fmt: skip
    trainer.fit(TinyRegression(), batches())
    return trainer


def only_run(client: MlflowClient, experiment_name: str):
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def test_one_run_holds_lightnings_metrics_and_params_and_the_profile(tmp_path, tracking_uri, strict):
    logger = MLFlowLogger(experiment_name="lightning-tiny", run_name="tiny", tracking_uri=tracking_uri)
    callback = ProfilerCallback(wait=1, warmup=1, active=2, repeat=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MLflowNeuronWarning)
        fit(tmp_path, callback, logger=logger, max_steps=10)

    client = MlflowClient(tracking_uri)
    run = only_run(client, "lightning-tiny")
    assert run.info.run_id == logger.run_id
    assert run.info.status == "FINISHED"
    run_id, metrics, params = run.info.run_id, run.data.metrics, run.data.params
    # Lightning's own logging, every step, and the profile, once per cycle, in the same run.
    assert len(client.get_metric_history(run_id, "train_loss")) == 10
    cycle_steps = [m.step for m in client.get_metric_history(run_id, "profiler/total/active_steps")]
    assert cycle_steps == [4, 8]  # 2 cycles of wait 1 + warmup 1 + active 2; batches 9-10 unprofiled
    assert metrics["profiler/total/active_steps"] == 2
    assert metrics["profiler/total/aten_calls"] > 0
    assert metrics["profiler/calls/aten.addmm"] > 0
    assert run.data.tags["mlflow_neuron.device"] == "cpu"
    assert set(artifact_files(client, run_id)) == ({f"profiler/step_{s}/{f}" for s in (4, 8) for f in CYCLE_FILES}
                                                   | {node_file(socket.gethostname(), s, 0) for s in (4, 8)})
    # Lightning's hyperparameters and the profiler's settings side by side, none clashing.
    assert {"lr": "0.05", "hidden": "16"}.items() <= params.items()
    assert params["profiler.schedule.active"] == "2" and params["profiler.schedule.repeat"] == "2"
    assert params["profiler.device"] == "cpu"
    assert not callback.profiler.running
    assert callback.callback.run_id == run_id


def test_without_an_mlflow_logger_the_profile_goes_to_the_active_run(tmp_path, tracking_uri, strict):
    mlflow.set_experiment("lightning-active-run")
    with mlflow.start_run(run_name="mine") as run:
        fit(tmp_path, ProfilerCallback(wait=0, warmup=1, active=1), logger=False, max_steps=3)
    client = MlflowClient(tracking_uri)
    only = only_run(client, "lightning-active-run")
    assert only.info.run_id == run.info.run_id
    assert "profiler/total/self_cpu_time_us" in only.data.metrics


def test_repeat_zero_profiles_cycles_until_training_ends(tmp_path, tracking_uri, strict):
    logger = MLFlowLogger(experiment_name="lightning-repeat", tracking_uri=tracking_uri)
    fit(tmp_path, ProfilerCallback(wait=0, warmup=1, active=1, repeat=0), logger=logger, max_steps=7)
    history = MlflowClient(tracking_uri).get_metric_history(logger.run_id, "profiler/total/active_steps")
    # Not 7 too: the window that begins with the last step would hold no training step.
    assert [m.step for m in history] == [2, 4, 6]


def test_a_cycle_cut_short_by_the_end_of_training_is_logged_with_the_steps_it_has(tmp_path, tracking_uri, strict):
    logger = MLFlowLogger(experiment_name="lightning-cut", tracking_uri=tracking_uri)
    fit(tmp_path, ProfilerCallback(wait=0, warmup=1, active=3), logger=logger, max_steps=3)
    [cycle] = MlflowClient(tracking_uri).get_metric_history(logger.run_id, "profiler/total/active_steps")
    # Batches 2 and 3 ran in the window; torch also counts the profiler step that stop() cut short.
    assert (cycle.step, cycle.value) == (3, 3)


def test_training_shorter_than_the_first_cycle_warns_once_and_trains_on(tmp_path, tracking_uri):
    logger = MLFlowLogger(experiment_name="lightning-short", tracking_uri=tracking_uri)
    with pytest.warns(MLflowNeuronWarning, match="before the first profiler cycle"):
        trainer = fit(tmp_path, ProfilerCallback(wait=3, warmup=1, active=1), logger=logger, max_steps=2)
    assert trainer.global_step == 2
    run = MlflowClient(tracking_uri).get_run(logger.run_id)
    assert not any(k.startswith("profiler/") for k in run.data.metrics)


def test_a_profiler_that_cannot_start_warns_and_training_goes_on(tmp_path, tracking_uri, monkeypatch):
    import mlflow_neuron._capture.scheduled as integration

    def no_setup(*args, **kwargs):
        raise RuntimeError("no profiler today")

    monkeypatch.setattr(integration, "profiling_setup", no_setup)
    logger = MLFlowLogger(experiment_name="lightning-broken", tracking_uri=tracking_uri)
    with pytest.warns(MLflowNeuronWarning, match="could not start.*no profiler today"):
        trainer = fit(tmp_path, ProfilerCallback(), logger=logger, max_steps=4)
    assert trainer.global_step == 4
    assert len(MlflowClient(tracking_uri).get_metric_history(logger.run_id, "train_loss")) == 4


def test_strict_mode_raises_what_would_have_been_a_warning(tmp_path, tracking_uri, monkeypatch, strict):
    import mlflow_neuron._capture.scheduled as integration

    monkeypatch.setattr(integration, "profiling_setup", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        fit(tmp_path, ProfilerCallback(), logger=False, max_steps=2)


def test_refuses_to_run_next_to_lightnings_own_pytorch_profiler(tmp_path):
    from lightning.pytorch.profilers import PyTorchProfiler

    class UnstartedPyTorchProfiler(PyTorchProfiler):
        def __del__(self):  # Lightning's own raises when its profiler never started
            pass

    with pytest.raises(ValueError, match="one profiler at a time"):
        fit(tmp_path, ProfilerCallback(), logger=False, max_steps=1, profiler=UnstartedPyTorchProfiler())


def test_every_rank_profiles_not_only_global_rank_zero(tracking_uri):
    import types

    callback = ProfilerCallback()
    trainer = types.SimpleNamespace(is_global_zero=False, loggers=[])
    module = types.SimpleNamespace(device=torch.device("cpu"))
    callback.on_train_batch_start(trainer, module, None, 0)
    callback.on_train_batch_end(trainer, module, None, None, 0)
    assert callback.callback is not None and callback.profiler.running
    callback.on_train_end(trainer, module)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"active": 0}, ValueError, r"active must be an int >= 1; got 0 \(schedule: skip_first >= 0"),
        ({"wait": -1}, ValueError, "wait must be an int >= 0; got -1"),
        ({"warmup": 1.5}, ValueError, "warmup must be an int >= 0; got 1.5"),
        ({"repeat": True}, ValueError, "repeat must be an int >= 0; got True"),
        ({"device": 0}, TypeError, "device must be a device type"),
        ({"handlers": [print, "x"]}, TypeError, "handlers must be callables"),
        ({"top_kk": 5}, TypeError, r"unknown option\(s\) top_kk; options go to MLflowProfilerCallback, .*top_k"),
    ],
)
def test_bad_settings_are_rejected_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        ProfilerCallback(**kwargs)


def test_defaults_and_options_pass_through():
    callback = ProfilerCallback(top_k=5, strict=True)
    assert callback.profiler.schedule == {"skip_first": 0, "wait": 1, "warmup": 1, "active": 3, "repeat": 1}
    assert callback.profiler.options == {"top_k": 5, "strict": True}
    assert callback.callback is None  # made when training starts, for the run it finds then


def test_without_lightning_the_module_says_how_to_install_it(tmp_path):
    error = import_error_without(("lightning", "pytorch_lightning"), "mlflow_neuron.lightning", tmp_path)
    assert error.startswith("mlflow_neuron.lightning needs Lightning")
    assert 'pip install "mlflow-neuron[lightning]"' in error


def test_importing_mlflow_neuron_imports_no_training_framework(tmp_path):
    code = (
        "import sys, mlflow_neuron; from mlflow_neuron import MLflowProfilerCallback; "
        "frameworks = {'lightning', 'pytorch_lightning', 'transformers', 'accelerate'}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & frameworks))"
    )
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
