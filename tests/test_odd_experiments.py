"""Every command that reads runs, against odd experiments: none of our failures may exit 0 or 1.

Exit 1 is the gate's "regression found" (`compare --fail-if-slower`, `history --fail-on-change`),
so a CI job reads it as one: a crash that exits 1 fails a build for a regression nobody made, and
one that exits 0 passes a build nobody checked. Here each command runs against an empty experiment,
one with a single run, one whose runs all carry the same commit (the README example's, where
`history` once ended in a KeyError), and one whose runs have no profiles. Each must exit 0 with its
answer, 1 only with the line that names the regression, or another code with one line on stderr.
"""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from mlflow_neuron._record.model import DEVICE_TAG
from mlflow_neuron.cli import main as cli_main
from mlflow_neuron.cli.arguments import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE

COMMIT = "9176c9f0e76c4c2f"
NIGHTS = 8  # four small steps, then four large ones: a change in the middle of one commit's runs


def _profiled(experiment_id: str, name: str, size: int, commit: str | None) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from mlflow_neuron import MLflowProfilerCallback

    x = torch.ones(size, size)
    with mlflow.start_run(experiment_id=experiment_id, run_name=name) as run:
        if commit:
            mlflow.set_tag("mlflow.source.git.commit", commit)
        callback = MLflowProfilerCallback(process="inline", background=False, log_timeline=False, strict=True)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=5),
                     on_trace_ready=callback) as prof:  # fmt: skip
            for _ in range(7):
                x * 2
                prof.step()
        callback.close()
    return run.info.run_id


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """A store with the four odd experiments; returns (uri, {what: run id})."""
    tmp = tmp_path_factory.mktemp("odd")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    ids = {name: client.create_experiment(name, artifact_location=(tmp / name).as_uri())
           for name in ("empty", "one", "same-commit", "unprofiled")}  # fmt: skip
    mlflow.set_tracking_uri(uri)
    try:
        runs = {"one": _profiled(ids["one"], "solo", 8, COMMIT)}
        for night in range(NIGHTS):
            # 64 elements, then 4M: a step 100x longer, which no load on a shared machine hides
            runs[f"night{night}"] = _profiled(ids["same-commit"], "nightly", 8 if night < NIGHTS // 2 else 2048, COMMIT)
        runs["plain"] = client.create_run(ids["unprofiled"], run_name="plain").info.run_id
        # tagged as profiled (the callback's first act) but no cycle ever arrived
        runs["no-cycles"] = client.create_run(ids["unprofiled"], run_name="no-cycles", tags={DEVICE_TAG: "cpu"}).info.run_id
    finally:
        mlflow.set_tracking_uri(None)
    return uri, runs


def _commands(uri: str, runs: dict[str, str]) -> list[list[str]]:
    lines = []
    for experiment in ("empty", "one", "same-commit", "unprofiled", "missing"):
        lines += [
            ["compare", "--experiment", experiment],
            ["compare", "--experiment", experiment, "--fail-if-slower", "10", "--fail-if-inconclusive"],
            ["compare", "--experiment", experiment, "--region", "rmsnorm"],
            ["history", "--experiment", experiment],
            ["history", "--experiment", experiment, "--fail-on-change", "10", "--format", "json"],
            ["history", "--experiment", experiment, "--run-name", "nightly", "--format", "markdown"],
            ["history", "--experiment", experiment, "--op", "aten::mul", "--format", "csv"],
        ]
    lines += [
        ["compare", "--runs", runs["plain"], runs["one"]],
        ["compare", "--runs", runs["no-cycles"], runs["one"]],
        ["open", runs["plain"], "--no-launch", "--dest", "unused"],
        ["open", runs["one"], "--step", "999", "--no-launch", "--dest", "unused"],
        ["annotate", "--model", "nobody", "--version", "1", "--run", runs["one"]],
    ]
    return [[*argv, "--tracking-uri", uri] for argv in lines]


def _run(argv: list[str]) -> int:
    try:
        return cli_main(argv)
    except SystemExit as exited:  # argparse's usage errors
        return exited.code


def test_every_command_on_odd_experiments_exits_1_only_for_a_regression_and_fails_in_one_line(odd, capsys, tmp_path,
                                                                                                monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    uri, runs = odd
    seen = {}
    for argv in _commands(uri, runs):
        code = _run(argv)
        out, err = capsys.readouterr()
        seen[" ".join(argv[:3])] = code
        assert "Traceback" not in out + err, (argv, err)
        if code == EXIT_FAILED:  # only with the line that names what got slower
            assert any(line.startswith(("REGRESSION ", "CHANGE ")) for line in out.splitlines()), (argv, out)
        elif code != EXIT_OK:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"mlflow-neuron {argv[0]}: error: "), (argv, err)
            assert code in (EXIT_USAGE, 4), (argv, code, err)
    # what each odd experiment gets
    assert seen["compare --experiment empty"] == EXIT_USAGE and seen["history --experiment one"] == EXIT_USAGE
    assert seen["compare --experiment unprofiled"] == EXIT_USAGE and seen["history --experiment missing"] == EXIT_USAGE


def test_history_of_runs_that_share_one_commit_names_the_change_by_place(odd, capsys):
    uri, _ = odd
    assert cli_main(["history", "--experiment", "same-commit", "--tracking-uri", uri]) == EXIT_OK
    out = capsys.readouterr().out
    assert "SLOWER" in out and "series runs 5..8 vs series runs 1..4: slower" in out, out
    assert cli_main(["history", "--experiment", "same-commit", "--tracking-uri", uri, "--fail-on-change", "10"]) == 1
    assert f"CHANGE {COMMIT} -> {COMMIT}: ratio" in capsys.readouterr().out


def test_a_bug_of_ours_exits_70_in_one_line_never_1(monkeypatch, capsys):
    from mlflow_neuron.cli import commands

    def broken(args, out=None):
        raise KeyError("run 9176c9f0e76c")

    monkeypatch.setitem(commands.COMMANDS, "history", broken)
    assert cli_main(["history", "--experiment", "x"]) == EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert err == ("mlflow-neuron history: error: internal error, a bug in mlflow-neuron: KeyError: 'run 9176c9f0e76c' "
                   "(-v prints the traceback)\n")  # fmt: skip
    assert cli_main(["history", "--experiment", "x", "-v"]) == 70
    assert "Traceback" in capsys.readouterr().err
