"""Transformers: a tiny BERT built from a config (no hub download) trained a few steps on CPU.

The profile must land in the run that the Trainer's own `MLflowCallback` (report_to=["mlflow"])
logs to.
"""

from __future__ import annotations

import types
import socket
import warnings

import mlflow
import pytest
import torch
from conftest import artifact_files, import_error_without
from mlflow.tracking import MlflowClient

from mlflow_neuron import MLflowNeuronWarning
from mlflow_neuron._record.model import node_file

transformers = pytest.importorskip(
    "transformers", reason='Transformers is not installed (pip install "mlflow-neuron[transformers]")'
)
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402
from transformers.integrations import MLflowCallback  # noqa: E402

from mlflow_neuron.transformers import ProfilerCallback  # noqa: E402

# region_ops.json: the profiled steps hold record_function ranges (regions) of the Trainer or the model
CYCLE_FILES = {"ops.json", "steps.json", "step_totals.json", "timeline.json", "key_averages.txt", "manifest.json",
               "trace.json.gz", "region_ops.json"}
VOCAB, SEQ = 64, 16


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    for name in ("DISABLE_MLFLOW_INTEGRATION", "MLFLOW_RUN_ID", "MLFLOW_NESTED_RUN", "HF_MLFLOW_LOG_ARTIFACTS"):
        monkeypatch.delenv(name, raising=False)


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, VOCAB, (SEQ,), generator=g), "labels": torch.tensor(i % 2)}


def tiny_bert():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=SEQ, num_labels=2,
    )  # fmt: skip
    return BertForSequenceClassification(config)


def trainer_for(tmp_path, callback, *, report_to=("mlflow",), max_steps=8, **args):
    settings = dict(
        report_to=list(report_to), max_steps=max_steps, per_device_train_batch_size=8, logging_steps=1,
        use_cpu=True, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, run_name="tiny-bert",
    )  # fmt: skip
    arguments = TrainingArguments(str(tmp_path / "out"), **{**settings, **args})
    return Trainer(model=tiny_bert(), args=arguments, train_dataset=RandomTokens(), callbacks=[callback])


def only_run(client: MlflowClient, experiment_name: str):
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def test_one_run_holds_the_trainers_metrics_and_params_and_the_profile(tmp_path, tracking_uri, strict, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-tiny")
    callback = ProfilerCallback(wait=1, warmup=1, active=2, repeat=2, flush_timeout_s=300)  # whatever the load
    trainer = trainer_for(tmp_path, callback, max_steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MLflowNeuronWarning)
        trainer.train()

    client = MlflowClient(tracking_uri)
    run = only_run(client, "hf-tiny")
    assert run.info.run_name == "tiny-bert" and run.info.status == "FINISHED"
    run_id, metrics, params = run.info.run_id, run.data.metrics, run.data.params
    # The Trainer's logging (MLflowCallback), every step, and the profile, once per cycle.
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(1, 11))
    assert {"grad_norm", "learning_rate", "train_runtime", "train_loss"} <= set(metrics)
    cycle_steps = [m.step for m in client.get_metric_history(run_id, "profiler/total/active_steps")]
    assert cycle_steps == [4, 8]  # the Trainer's global steps: the cycle of steps 3-4 sits next to their loss
    assert metrics["profiler/total/aten_calls"] > 0
    assert metrics["profiler/calls/aten.addmm"] > 0
    assert run.data.tags["mlflow_neuron.device"] == "cpu"
    assert set(artifact_files(client, run_id)) == ({f"profiler/step_{s}/{f}" for s in (4, 8) for f in CYCLE_FILES}
                                                   | {node_file(socket.gethostname(), s, 0) for s in (4, 8)})
    # The Trainer's arguments and model config next to the profiler's settings, none clashing.
    assert params["max_steps"] == "10" and params["hidden_size"] == "32"
    assert params["profiler.schedule.active"] == "2" and params["profiler.device"] == "cpu"
    trainer_keys = {k for k in params if not k.startswith(("profiler.", "versions.", "neuron."))}
    assert len(trainer_keys) > 50
    assert not callback.profiler.running
    assert callback.callback.run_id == run_id


def test_the_order_of_the_callbacks_does_not_matter(tmp_path, tracking_uri, strict, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-order")
    callback = ProfilerCallback(wait=0, warmup=1, active=1)
    trainer = trainer_for(tmp_path, callback, max_steps=3)
    callbacks = trainer.callback_handler.callbacks
    callbacks.insert(0, callbacks.pop(callbacks.index(callback)))  # ours now runs before MLflowCallback
    assert callbacks.index(callback) < next(i for i, c in enumerate(callbacks) if isinstance(c, MLflowCallback))
    trainer.train()
    run = only_run(MlflowClient(tracking_uri), "hf-order")
    assert callback.callback.run_id == run.info.run_id
    assert "loss" in run.data.metrics and "profiler/total/self_cpu_time_us" in run.data.metrics


def test_a_profiler_step_is_an_optimizer_step(tmp_path, tracking_uri, strict, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-accumulate")
    trainer = trainer_for(
        tmp_path, ProfilerCallback(wait=0, warmup=1, active=1, repeat=2), max_steps=4,
        per_device_train_batch_size=4, gradient_accumulation_steps=2,
    )  # fmt: skip
    trainer.train()
    client = MlflowClient(tracking_uri)
    run = only_run(client, "hf-accumulate")
    history = client.get_metric_history(run.info.run_id, "profiler/total/active_steps")
    assert [(m.step, m.value) for m in history] == [(2, 1), (4, 1)]


def test_without_mlflow_reporting_the_profile_gets_a_run_of_its_own(tmp_path, tracking_uri, strict, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-no-reporting")
    mlflow.set_experiment("hf-no-reporting")
    callback = ProfilerCallback(wait=0, warmup=1, active=1)
    trainer_for(tmp_path, callback, report_to=(), max_steps=2).train()
    run = only_run(MlflowClient(tracking_uri), "hf-no-reporting")
    assert run.info.status == "FINISHED"  # the callback created it and ended it with training
    assert "profiler/total/self_cpu_time_us" in run.data.metrics
    assert "loss" not in run.data.metrics


def test_training_shorter_than_the_first_cycle_warns_once_and_trains_on(tmp_path, tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-short")
    trainer = trainer_for(tmp_path, ProfilerCallback(wait=2, warmup=1, active=1), max_steps=2)
    with pytest.warns(MLflowNeuronWarning, match="before the first profiler cycle"):
        trainer.train()
    assert trainer.state.global_step == 2
    run = only_run(MlflowClient(tracking_uri), "hf-short")
    assert "loss" in run.data.metrics
    assert not any(k.startswith("profiler/") for k in run.data.metrics)


def test_every_process_profiles_not_only_the_world_process_zero(tracking_uri):
    callback = ProfilerCallback()
    args = types.SimpleNamespace(device=torch.device("cpu"))
    callback.on_step_begin(args, types.SimpleNamespace(is_world_process_zero=False), None)
    callback.on_step_end(args, types.SimpleNamespace(is_world_process_zero=False), None)
    assert callback.callback is not None and callback.profiler.running
    callback.on_train_end(args, types.SimpleNamespace(is_world_process_zero=False), None)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"active": 0}, ValueError, "active must be an int >= 1; got 0"),
        ({"skip_first": -2}, ValueError, "skip_first must be an int >= 0; got -2"),
        ({"profile_output_dir": 3}, TypeError, "profile_output_dir must be a path or None"),
        ({"schedule": (1, 1, 3)}, TypeError, r"unknown option\(s\) schedule"),
    ],
)
def test_bad_settings_are_rejected_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        ProfilerCallback(**kwargs)


def test_without_transformers_the_module_says_how_to_install_it(tmp_path):
    error = import_error_without(("transformers",), "mlflow_neuron.transformers", tmp_path)
    assert error.startswith("mlflow_neuron.transformers needs Hugging Face Transformers")
    assert 'pip install "mlflow-neuron[transformers]"' in error
