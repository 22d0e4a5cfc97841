"""Multi-rank jobs into one run on a real `mlflow server`: sqlite, and PostgreSQL as in production."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TESTS
from fault_scenarios import FAST_FAILING_CLIENT
from mlflow.tracking import MlflowClient
from servers import MlflowServer, drop_postgres_database, free_port, postgres_uri, scratch_postgres_database

from mlflow_neuron.cli import exit_code, sync

RANKS, CYCLES = 4, 20
NEURON_FILES_PER_SESSION = 6  # trace.json, ntrace.pb, trace_info.pb, one .neff, two .ntff


def launch_ranks(server_uri, out, ranks, cycles, *args):
    env = {**os.environ, **FAST_FAILING_CLIENT, "WORLD_SIZE": str(ranks), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(TESTS / "rank_worker.py"), "--tracking-uri", server_uri, "--out", str(out),
             "--cycles", str(cycles), *args],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return sorted(results, key=lambda r: r["rank"])


def assert_every_rank_and_cycle_once(client, run_id, results, ranks, cycles):
    """Every cycle is delivered or kept in its rank's outbox, counted as such; once what was kept
    is synced (a busy machine keeps some: a helper's queue holds 8), each is in the run once."""
    steps = [4 * (i + 1) for i in range(cycles)]
    assert [r["steps"] for r in results] == [4 * cycles] * ranks
    counts = [(r["rank"], r["cycles_read"], r["delivered"], len(r["kept"])) for r in results]
    assert all(read == cycles and delivered + kept == cycles for _, read, delivered, kept in counts), counts
    for outbox in sorted({str(Path(kept).parent) for r in results for kept in r["kept"]}):
        assert exit_code(sync(outbox, out=io.StringIO())) == 0
    assert [m.step for m in client.get_metric_history(run_id, "profiler/total/active_steps")] == steps
    for rank in range(ranks):
        history = client.get_metric_history(run_id, f"profiler/rank_{rank}/total/aten_calls")
        assert sorted(m.step for m in history) == steps
    for step in steps:
        neuron = [a.path for a in client.list_artifacts(run_id, f"profiler/step_{step}/neuron")]
        assert len(neuron) == ranks  # one `<instance>_pid_<pid>` folder per rank, none clobbered
        sessions = [s.path for folder in neuron for s in client.list_artifacts(run_id, folder)]
        files = [f for s in sessions for f in client.list_artifacts(run_id, s)]
        assert len(files) == ranks * NEURON_FILES_PER_SESSION
        own = {a.path for a in client.list_artifacts(run_id, f"profiler/step_{step}")}
        assert {f"profiler/step_{step}/rank_{r}" for r in range(1, ranks)} | {f"profiler/step_{step}/ops.json"} <= own


def load_test(workdir: Path, backend_store_uri=None, *worker_args):
    with MlflowServer(workdir / "server", backend_store_uri) as server:
        server.start(timeout=120)
        client = MlflowClient(server.uri)
        run_id = client.create_run("0").info.run_id
        results = launch_ranks(server.uri, workdir / "np", RANKS, CYCLES, "--run-id", run_id, "--all-ranks",
                               *worker_args)  # fmt: skip
        assert_every_rank_and_cycle_once(client, run_id, results, RANKS, CYCLES)
        return results


def test_four_ranks_twenty_cycles_into_one_run(tmp_path):
    results = load_test(tmp_path, None, "--helper")


def test_four_ranks_twenty_cycles_with_a_postgresql_backend(tmp_path):
    base = postgres_uri()
    if base is None:
        pytest.skip("MLFLOW_NEURON_TEST_POSTGRES_URI not set (.ci/run sets it up with .ci/postgres.sh)")
    name = f"mlflow_neuron_load_{os.getpid()}"
    try:
        load_test(tmp_path, scratch_postgres_database(base, name))
    finally:
        drop_postgres_database(base, name)


def test_ranks_under_torch_distributed_share_rank_zeros_new_run(tmp_path):
    with MlflowServer(tmp_path / "server") as server:
        server.start()
        results = launch_ranks(server.uri, tmp_path / "np", 2, 2, "--dist-port", str(free_port()))
        run_ids = {r["run_id"] for r in results}
        assert len(run_ids) == 1 and None not in run_ids
        client = MlflowClient(server.uri)
        [run] = client.search_runs(["0"])
        assert run.info.status == "FINISHED"  # rank 0 created it and ended it
        history = client.get_metric_history(run.info.run_id, "profiler/total/active_steps")
        assert [m.step for m in history] == [4, 8]  # rank 0 logs metrics; rank 1 only its files
        assert len(client.list_artifacts(run.info.run_id, "profiler/step_4/neuron")) == 2
