"""Recorded runs for the output-equality test (`test_recorded_output.py`): one store, made once.

`record(folder)` writes a sqlite store and its artifact folder with:
- experiment "nightly": 12 runs cloned from one real profiled run on the fake device
  (`nightly_series`), a day apart, 1.3x slower from run 8 (`compare`, the gate, `history`, `annotate`);
- experiment "ranks": a 4-rank job whose rank 2 computes 30 ms longer a step (`rank_shapes`), 2 cycles;
- experiment "neuron": a run profiled through the callback with the `torch_neuronx.profiling` double
  (two cycles, each with its Neuron session folder: `open`);
- registered model "rmsnorm" version 1, from the last nightly run (`annotate`).

The commands' outputs on it are in `fixtures/recorded/expected/`. Both are remade only when an
output is meant to change, with the command in `test_recorded_output.py`'s docstring.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURE = TESTS / "fixtures" / "recorded"
STORE_ARCHIVE = FIXTURE / "store.tar.gz"
EXPECTED = FIXTURE / "expected"
ROOT_MARK = "@ROOT@"  # where the store's folder was, in every path the store holds


def record(folder: Path) -> dict[str, str]:
    """Makes the store in `folder` (mlflow.db, artifacts/); returns the ids the commands name."""
    sys.path[:0] = [str(TESTS), str(TESTS / "doubles")]
    from mlflow.tracking import MlflowClient

    import fake_device
    from nightly_series import Cloner, make_template
    from rank_shapes import Job, cycles, log_job

    folder = Path(folder).resolve()
    artifacts = folder / "artifacts"
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    so = fake_device.build(folder.parent / "fake_device_build")
    template = make_template(folder.parent / "template", so)
    Cloner(template, uri, artifacts).make("nightly", 12, slower_from=8, run_name="v{i:02d}")
    client = MlflowClient(uri)
    nightly = client.get_experiment_by_name("nightly").experiment_id
    runs = {r.info.run_name: r.info.run_id for r in client.search_runs([nightly])}

    ranks_experiment = client.create_experiment("ranks", artifact_location=(artifacts / "ranks").as_uri())
    ranks_run = client.create_run(ranks_experiment, run_name="job", start_time=1_700_000_000_000).info.run_id
    log_job(client, ranks_run, cycles(Job(world_size=4, slow_rank=2, delay_us=30_000)))
    client.set_terminated(ranks_run, end_time=1_700_000_600_000)

    neuron_run = _neuron_run(uri, artifacts / "neuron", folder.parent / "neuron_out")

    client.create_registered_model("rmsnorm")
    client.create_model_version("rmsnorm", f"runs:/{runs['v11']}/model", run_id=runs["v11"])
    return {"baseline": runs["v00"], "latest": runs["v11"], "ranks": ranks_run, "neuron": neuron_run}


def _neuron_run(uri: str, artifact_dir: Path, out: Path) -> str:
    import mlflow
    import torch_neuronx.profiling as profiling
    from workloads import profile_rmsnorm

    from mlflow_neuron import MLflowProfilerCallback

    os.environ.setdefault("TORCH_NEURONX_NEFF_CACHE_DIR", str(Path(tempfile.gettempdir()) / "neff-cache-stand-in"))
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("neuron", artifact_location=artifact_dir.as_uri())
    config = profiling.NeuronConfig(profile_output_dir=str(out))
    exporter = profiling.NeuronProfiler(config)
    with mlflow.start_run(experiment_id=experiment, run_name="rmsnorm-neuron") as run:
        callback = MLflowProfilerCallback(exporter.export_trace, process="inline", background=False)
        profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2, experimental_config=config)
        callback.close()
    return run.info.run_id
