"""`mlflow-neuron ranks`, `rank_summary()` and rank summaries in `compare` and `history`, read from
a real sqlite store (and, for 64 ranks, through a real `mlflow server`).

The runs' rank summaries are written with MlflowClient in the exact format each rank logs
(`tests/rank_shapes.py`), from chosen numbers: a 4-rank job whose rank 2 computes 30 ms longer
each step, so the truth is known (the other ranks wait 30 ms a step at the all_reduce, rank 2
waits nothing). The all_reduce's transfer takes 12 ms on every rank (40% of the wait), so a wait
that took in the transfer (the whole time in the collective) would read 42 ms on ranks 0, 1 and 3
and 12 ms on rank 2, outside every bound below.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from rank_shapes import Job, cycles, log_job
from servers import MlflowServer

from mlflow_neuron.cli import main as cli_main
from mlflow_neuron.cli.arguments import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

ISSUE_KEYS = {"world_size", "ranks", "straggler"}
RANK_KEYS = {"rank", "host", "step_time_us", "collective_us", "wait_us", "exposed_comm_pct", "idle_pct"}
STRAGGLER_KEYS = {"rank", "host", "arrived_last_pct", "others_wait_us"}
TRANSFER_US = 12_000.0  # a sizeable part of the 30 ms wait: wait and wait + transfer are told apart
SLOW = Job(world_size=4, slow_rank=2, delay_us=30_000, transfer_us=TRANSFER_US,
           hosts=["ip-10-0-3-5", "ip-10-0-3-6", "ip-10-0-3-7", "ip-10-0-3-8"])  # fmt: skip
EVEN = Job(world_size=4, transfer_us=TRANSFER_US, hosts=SLOW.hosts)


def new_run(client: MlflowClient, job: Job | None = None, name: str = "job", skip=frozenset(), **kwargs) -> str:
    run_id = client.create_run("0", run_name=name).info.run_id
    if job is not None:
        log_job(client, run_id, cycles(job, **kwargs), skip=skip)
    return run_id


def ranks_json(run_id: str, capsys, *extra: str) -> dict:
    assert cli_main(["ranks", run_id, "--format", "json", *extra]) == EXIT_OK
    return json.loads(capsys.readouterr().out)


def test_the_slow_rank_is_named_and_the_others_wait_for_it(tracking_uri, capsys):
    run_id = new_run(MlflowClient(), SLOW)
    report = ranks_json(run_id, capsys)
    assert set(report) >= ISSUE_KEYS and report["world_size"] == 4
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    assert all(set(r) >= RANK_KEYS and set(r["step_time_us"]) == {"median", "low", "high"} for r in report["ranks"])
    assert set(report["straggler"]) >= STRAGGLER_KEYS
    assert report["straggler"]["rank"] == 2 and report["straggler"]["host"] == "ip-10-0-3-7"
    waits = {r["rank"]: r["wait_us"] for r in report["ranks"]}
    # the wait is the time until the last rank arrived, without the 12 ms transfer (that would read 12 and 42 ms)
    assert waits[2] < 5_000, waits
    assert all(abs(waits[r] - 30_000) < 0.2 * 30_000 for r in (0, 1, 3)), waits
    assert all(abs(r["collective_us"] - (r["wait_us"] + TRANSFER_US)) < 1 for r in report["ranks"])  # wait + transfer


def test_without_a_slow_rank_no_straggler_is_named(tracking_uri, capsys):
    report = ranks_json(new_run(MlflowClient(), EVEN), capsys)
    assert report["straggler"] is None
    assert cli_main(["ranks", new_run(MlflowClient(), EVEN, "again"), "--format", "table"]) == EXIT_OK
    assert "rank 2" not in capsys.readouterr().out.split("\n\n", 1)[1]  # the sentence names no rank


def test_the_table_has_a_row_per_rank_then_the_sentence_and_markdown_the_same(tracking_uri, capsys):
    run_id = new_run(MlflowClient(), SLOW)
    assert cli_main(["ranks", run_id]) == EXIT_OK
    table, sentence = capsys.readouterr().out.split("\n\n", 1)
    rows = table.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"]
    assert "ip-10-0-3-7" in rows[2] and "rank 2" in sentence
    assert cli_main(["ranks", run_id, "--format", "markdown"]) == EXIT_OK
    markdown = capsys.readouterr().out
    assert sum(line.startswith("| ") for line in markdown.splitlines()) == 5 and "rank 2" in markdown


def test_log_to_attaches_the_picture_and_the_run_metrics(tracking_uri, capsys, tmp_path):
    client = MlflowClient()
    run_id = new_run(client, SLOW)
    assert cli_main(["ranks", run_id, "--log-to", run_id]) == EXIT_OK
    assert "attached ranks/ranks.png" in capsys.readouterr().out
    run = client.get_run(run_id)
    assert run.data.metrics["profiler/ranks/straggler"] == 2
    assert abs(run.data.metrics["profiler/ranks/median_wait_us"] - 30_000) < 6_000
    assert run.data.metrics["profiler/ranks/step_time_skew_pct"] < 1  # every rank's step is as long as the slowest
    assert run.data.tags["mlflow_neuron.ranks.straggler_host"] == "ip-10-0-3-7"
    assert {a.path for a in client.list_artifacts(run_id, "ranks")} == {"ranks/ranks.png", "ranks/ranks.json"}
    png = client.download_artifacts(run_id, "ranks/ranks.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_picture_splits_each_step_into_parts_that_add_up_to_it(tracking_uri):
    from mlflow_neuron._report.ranks.chart import PARTS, figure, step_split
    from mlflow_neuron._readback.ranks import read_ranks

    read = read_ranks(new_run(MlflowClient(), Job(**{**SLOW.__dict__, "idle_us": 5_000.0})))
    split = step_split(read.report.steps)
    for row in split.to_dict("records"):
        steps = [s["step_us"] for summary in read.summaries if summary["rank"] == row["rank"] for s in summary["steps"]]
        assert abs(sum(row[p] for p in PARTS) - sum(steps) / len(steps)) < 1  # the bar is the mean step
    fig = figure(split, "title", straggler=2)
    drawn = {a.get_gid(): a.get_width() for a in fig.axes[0].patches}
    assert drawn["rank 2: wait"] < 5 and 25 < drawn["rank 0: wait"] < 35  # ms
    assert drawn["rank 2: compute"] > drawn["rank 0: compute"] + 25
    assert all(abs(drawn[f"rank {r}: idle"] - 5) < 0.01 for r in range(4))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()][2].endswith("straggler")


def test_rank_summary_returns_a_frame_with_a_row_per_rank(tracking_uri):
    from mlflow_neuron import rank_summary

    table = rank_summary(new_run(MlflowClient(), SLOW))
    assert len(table) == 4 and table.attrs["straggler"]["rank"] == 2 and table.attrs["world_size"] == 4


def test_a_single_process_run_says_it_has_one_rank(tracking_uri, capsys):
    run_id = new_run(MlflowClient(), Job(world_size=1, hosts=["laptop"]))
    assert cli_main(["ranks", run_id]) == EXIT_OK
    out = capsys.readouterr().out
    assert "one rank" in out.splitlines()[0]
    assert ranks_json(run_id, capsys)["straggler"] is None


def test_a_run_without_rank_summaries_says_so_and_exits_2(tracking_uri, capsys):
    run_id = new_run(MlflowClient())
    assert cli_main(["ranks", run_id]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()  # MLflow's own INFO lines (the store made in this process) before ours
    assert err.splitlines()[-1].startswith(f"mlflow-neuron ranks: error: run {run_id} has no rank summaries")
    assert "Traceback" not in err
    assert cli_main(["ranks", "0" * 32]) == EXIT_USAGE
    assert "no such run" in capsys.readouterr().err


def test_a_rank_that_sent_nothing_is_named_missing_and_a_damaged_file_left_out(tracking_uri, capsys, tmp_path):
    client = MlflowClient()
    run_id = new_run(client, SLOW, skip={3})
    damaged = tmp_path / "cycle_10.json"
    damaged.write_text("{not json", encoding="utf-8")
    client.log_artifact(run_id, str(damaged), "profiler/ranks/rank_5")
    assert cli_main(["ranks", run_id]) == EXIT_OK
    out = capsys.readouterr().out
    assert "profiler/ranks/rank_5/cycle_10.json left out: not JSON" in out
    assert "rank 3 sent no summary" in out
    assert [r["rank"] for r in ranks_json(run_id, capsys)["ranks"]] == [0, 1, 2]


def test_step_picks_one_cycle(tracking_uri, capsys):
    run_id = new_run(MlflowClient(), SLOW)
    assert ranks_json(run_id, capsys, "--step", "20")["straggler"]["rank"] == 2
    assert cli_main(["ranks", run_id, "--step", "7"]) == EXIT_USAGE
    assert "no rank summaries at step 7; steps that have: 10, 20" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["ranks", "not-a-run"], "argument run: expected a run id (32 hexadecimal digits), got 'not-a-run'"),
    (["ranks", "a" * 32, "--format", "csv"], "argument --format: invalid choice: 'csv'"),
    (["ranks", "a" * 32, "--step", "-1"], "argument --step: expected an integer >= 0, got '-1'"),
    (["ranks", "a" * 32, "--log-to", "x"], "argument --log-to: expected a run id"),
])  # fmt: skip
def test_bad_values_are_one_line_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "ranks --help" in err


def test_a_dead_server_is_one_line_and_exit_3_within_seconds(dead_server, tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mlflow_neuron.cli", "ranks", "a" * 32, "--tracking-uri", dead_server],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and dead_server in done.stderr
    assert time.monotonic() - started < 30  # not MLflow's minutes of retries


def test_help_says_what_ranks_prints(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["ranks", "--help"])
    assert exit_info.value.code == 0
    assert "straggler" in capsys.readouterr().out


def test_a_shifted_clock_on_one_rank_changes_nothing(tracking_uri, capsys):
    shifted = Job(**{**SLOW.__dict__, "clock_offset_us": {1: 50_000.0}})
    plain, moved = (ranks_json(new_run(MlflowClient(), job, name), capsys) for job, name in ((SLOW, "a"), (shifted, "b")))
    assert moved["straggler"]["rank"] == plain["straggler"]["rank"] == 2
    for a, b in zip(plain["ranks"], moved["ranks"]):
        assert abs(a["wait_us"] - b["wait_us"]) < 1


def test_sixty_four_ranks_are_read_through_a_server_each_once(tmp_path):
    job = Job(world_size=64, slow_rank=17, delay_us=20_000)
    with MlflowServer(tmp_path / "server") as server:
        client = MlflowClient(server.uri)
        run_id = new_run(client, job, count=1)
        done = subprocess.run([sys.executable, "-m", "mlflow_neuron.cli", "ranks", run_id, "--tracking-uri", server.uri,
                               "--format", "json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["rank"] for r in report["ranks"]] == list(range(64))
    assert report["straggler"]["rank"] == 17 and report["straggler"]["host"] == "ip-10-0-0-2"


def profiled_run(client: MlflowClient, name: str, job: Job, experiment_id: str = "0") -> str:
    """A run as compare reads it from its metrics (rank 0's steps as its self CPU time per step),
    with every rank's summaries beside it."""
    run_id = client.create_run(experiment_id, run_name=name, tags={"mlflow_neuron.device": "cpu",
                                                        "mlflow_neuron.device_time": "missing"}).info.run_id  # fmt: skip
    logged = cycles(job)
    for summaries in logged:
        cycle, steps = summaries[0]["cycle_step"], summaries[0]["steps"]
        client.log_metric(run_id, "profiler/total/active_steps", len(steps), step=cycle)
        for k, step in enumerate(steps):
            client.log_metric(run_id, "profiler/step/self_cpu_time_us", step["step_us"], step=cycle - len(steps) + k)
        client.log_metric(run_id, "profiler/self_cpu_time_us/all_reduce", steps[0]["collective_us"], step=cycle)
    log_job(client, run_id, logged)
    return run_id


def test_compare_says_the_step_got_slower_because_the_wait_grew_and_names_the_straggler(tracking_uri, capsys):
    client = MlflowClient()
    before, after = profiled_run(client, "before", EVEN), profiled_run(client, "after", SLOW)
    assert cli_main(["compare", "--runs", before, after, "--baseline", "before", "--format", "json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    words = report["sentences"]["after"]
    assert words.startswith("after vs before: slower")
    assert "rank 2" in words and "wait" in words
    assert report["ranks"]["after"]["straggler"]["rank"] == 2 and report["ranks"]["before"]["straggler"] is None


def test_compare_against_a_baseline_without_rank_summaries_says_nothing_of_ranks(tracking_uri, capsys):
    client = MlflowClient()
    after = profiled_run(client, "after", SLOW)
    before = profiled_run(client, "before", EVEN)
    for path in ("profiler/ranks",):  # the baseline was profiled before rank summaries existed
        repo = mlflow.get_run(before).info.artifact_uri.removeprefix("file://")
        import shutil

        shutil.rmtree(f"{repo}/{path}")
    assert cli_main(["compare", "--runs", before, after, "--baseline", "before", "--format", "json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert "Across ranks" not in report["sentences"]["after"]
    assert set(report["ranks"]) == {"after"}


def test_history_names_the_rank_that_was_the_straggler_in_most_of_the_latest_runs(tracking_uri, capsys):
    client = MlflowClient()
    experiment = client.create_experiment("nightly")
    for night in range(6):  # rank 2 slow every night but the second
        job = EVEN if night == 1 else Job(**{**SLOW.__dict__, "seed": night})
        profiled_run(client, f"night-{night}", job, experiment)
    assert cli_main(["history", "--experiment", "nightly"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "STRAGGLER rank 2 (host ip-10-0-3-7) was the straggler in 5 of the last 6 runs with rank summaries" in out


def test_history_names_a_host_whose_ranks_take_turns_as_the_straggler(tracking_uri, capsys):
    client = MlflowClient()
    experiment = client.create_experiment("nightly")
    hosts = ["ip-a", "ip-a", "ip-b", "ip-b"]
    for night, slow in enumerate([2, 3, 2, 3, 0]):
        profiled_run(client, f"night-{night}", Job(world_size=4, slow_rank=slow, delay_us=30_000, hosts=hosts,
                                                   seed=night), experiment)  # fmt: skip
    assert cli_main(["history", "--experiment", "nightly", "--format", "json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["straggler_line"] == "host ip-b held the straggler in 4 of the last 5 runs with rank summaries (ranks 2, 3)"
    assert [s["rank"] for s in report["stragglers"]] == [2, 3, 2, 3, 0]


def test_history_without_a_steady_straggler_prints_no_straggler_line(tracking_uri, capsys):
    client = MlflowClient()
    experiment = client.create_experiment("nightly")
    for night, slow in enumerate([0, 1, 2, 3, None]):
        profiled_run(client, f"night-{night}", Job(world_size=4, slow_rank=slow, delay_us=30_000, seed=night),
                     experiment)  # fmt: skip
    assert cli_main(["history", "--experiment", "nightly"]) == EXIT_OK
    assert "STRAGGLER" not in capsys.readouterr().out


def test_history_takes_the_wait_as_its_metric_and_finds_where_it_grew(tracking_uri, capsys):
    client = MlflowClient()
    experiment = client.create_experiment("nightly")
    for night in range(12):  # rank 2 slowed from the seventh night on
        base = SLOW if night >= 6 else EVEN
        profiled_run(client, f"night-{night}", Job(**{**base.__dict__, "seed": night}), experiment)
    client.create_run(experiment, run_name="no-ranks", tags={"mlflow_neuron.device": "cpu"})  # left out, counted
    assert cli_main(["history", "--experiment", "nightly", "--metric", "wait_us", "--format", "json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["metric"] == "wait_us" and report["without_rank_summaries"] == 1 and len(report["runs"]) == 12
    (change,) = report["changes"]
    assert change["verdict"] == "slower" and change["after_run_name"] == "night-6"
    assert "the median wait in collectives went from" in change["sentence"]
    assert report["straggler_line"].startswith("rank 2 (host ip-10-0-3-7) was the straggler in 6 of the last 10 runs")


def test_history_of_the_wait_takes_no_region(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["history", "--experiment", "x", "--metric", "wait_us", "--region", "fwd"])
    assert exit_info.value.code == EXIT_USAGE
    assert "--metric wait_us is the wait of the whole step" in capsys.readouterr().err
