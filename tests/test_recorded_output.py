"""`compare`, the gate, `history`, `ranks`, `annotate` and `open` print the same bytes on the same
runs: each command runs once against a recorded store (`recorded_runs.py`) and its output (stdout,
stderr, exit code) is compared with the one recorded in `fixtures/recorded/expected/`.

A move of code that changes nothing the user sees keeps this test green. A change that is meant to
change an output remakes the store and the expected outputs, and the diff shows what changed:

    python tests/test_recorded_output.py --record           # a new store, and its outputs
    python tests/test_recorded_output.py --expected-only    # the stored store's outputs again
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import sqlite3
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from recorded_runs import EXPECTED, FIXTURE, ROOT_MARK, STORE_ARCHIVE

IDS = FIXTURE / "ids.json"

COMMANDS = {  # name: the arguments after `mlflow-neuron`, with {ids} and @ROOT@ filled in
    "compare": ["compare", "--experiment", "nightly", "--runs", "v00", "v05", "v11", "--baseline", "v00"],
    "compare_json": ["compare", "--experiment", "nightly", "--runs", "v00", "v11", "--baseline", "v00",
                     "--format", "json"],
    "compare_markdown_cpu": ["compare", "--experiment", "nightly", "--runs", "v00", "v11", "--baseline", "v00",
                             "--format", "markdown", "--metric", "self_cpu_time_us"],
    "compare_many": ["compare", "--experiment", "nightly", "--baseline", "v00"],
    "compare_region": ["compare", "--experiment", "nightly", "--runs", "v00", "v11", "--baseline", "v00",
                       "--region", "block"],
    "gate": ["compare", "--experiment", "nightly", "--runs", "v00", "v09", "v11", "--baseline", "v00",
             "--fail-if-slower", "5"],
    "gate_inconclusive": ["compare", "--experiment", "nightly", "--runs", "v00", "v11", "--baseline", "v00",
                          "--metric", "self_cpu_time_us", "--fail-if-slower", "50", "--fail-if-inconclusive"],
    "history": ["history", "--experiment", "nightly"],
    "history_json": ["history", "--experiment", "nightly", "--format", "json"],
    "history_gate": ["history", "--experiment", "nightly", "--fail-on-change", "10"],
    "history_tables": ["history", "--experiment", "nightly", "--tables", "--format", "csv"],
    "ranks": ["ranks", "{ranks}"],
    "ranks_json": ["ranks", "{ranks}", "--format", "json"],
    "ranks_markdown_step": ["ranks", "{ranks}", "--format", "markdown", "--step", "10"],
    "annotate": ["annotate", "--model", "rmsnorm", "--version", "1", "--run", "{latest}", "--baseline", "{baseline}"],
    "open": ["open", "{neuron}", "--no-launch", "--dest", "@ROOT@/opened"],
}


def restore(folder: Path) -> str:
    """The recorded store, unpacked into `folder` with its paths made to point there; its URI."""
    with tarfile.open(STORE_ARCHIVE) as archive:
        archive.extractall(folder, filter="data")
    _replace_in_store(folder / "mlflow.db", ROOT_MARK, str(folder))
    return f"sqlite:///{folder / 'mlflow.db'}"


def _replace_in_store(db: Path, old: str, new: str) -> None:
    """Every text value in every table of the sqlite store, `old` replaced by `new`."""
    with sqlite3.connect(db) as connection:
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for _, column, kind, *_ in connection.execute(f'PRAGMA table_info("{table}")').fetchall():
                if kind.upper().startswith(("VARCHAR", "TEXT")):
                    connection.execute(f'UPDATE "{table}" SET "{column}" = REPLACE("{column}", ?, ?) '
                                       f'WHERE "{column}" LIKE ?', (old, new, f"%{old}%"))  # fmt: skip


def run_command(name: str, uri: str, folder: Path, ids: dict[str, str]) -> str:
    """The command's exit code, stdout and stderr as one text, with the store's folder as @ROOT@."""
    from mlflow_neuron.cli import main as cli_main

    argv = [a.format(**ids).replace(ROOT_MARK, str(folder)) for a in COMMANDS[name]] + ["--tracking-uri", uri]
    out, err = io.StringIO(), io.StringIO()
    # A user's `mlflow-neuron` process imports MLflow with MLFLOW_LOGGING_LEVEL=WARNING (the CLI's
    # default); in this worker another test may have imported it first at INFO, and a store
    # opened here then printed MLflow's "Creating initial MLflow database tables..." into stderr.
    mlflow_logger = logging.getLogger("mlflow")
    level = mlflow_logger.level
    mlflow_logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
    finally:
        mlflow_logger.setLevel(level)
    text = f"exit {code}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}"
    if name == "open":  # what it downloaded, too
        text += "--- files\n" + "".join(f"{p.relative_to(folder / 'opened').as_posix()}\n"
                                        for p in sorted((folder / "opened").rglob("*")) if p.is_file())  # fmt: skip
    if name == "annotate":  # and what it wrote on the model version
        from mlflow.tracking import MlflowClient

        tags = MlflowClient(uri).get_model_version("rmsnorm", "1").tags
        text += "--- tags\n" + "".join(f"{k} = {v}\n" for k, v in sorted(tags.items()))
    return text.replace(str(folder), ROOT_MARK)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recorded")
    return restore(folder), folder, json.loads(IDS.read_text())


@pytest.fixture
def no_explorer(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # `open` prints the command instead of running a real tool


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_command_prints_what_it_printed_when_recorded(name, recorded, no_explorer):
    uri, folder, ids = recorded
    expected = (EXPECTED / f"{name}.txt").read_text(encoding="utf-8")
    assert run_command(name, uri, folder, ids) == expected


def _record() -> None:
    """Makes the store anew and records every command's output on it."""
    import os

    from recorded_runs import record

    os.environ["PATH"] = "/usr/bin:/bin"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "store"
        folder.mkdir()
        ids = record(folder)
        _replace_in_store(folder / "mlflow.db", str(folder), ROOT_MARK)
        FIXTURE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(STORE_ARCHIVE, "w:gz") as archive:
            for part in ("mlflow.db", "artifacts"):
                archive.add(folder / part, part)
        IDS.write_text(json.dumps(ids, indent=1) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        uri = restore(folder)
        shutil.rmtree(EXPECTED, ignore_errors=True)
        EXPECTED.mkdir()
        for name in sorted(COMMANDS):
            (EXPECTED / f"{name}.txt").write_text(run_command(name, uri, folder, ids), encoding="utf-8")


def _expected_only() -> None:
    """Records every command's output again on the stored store (a changed output, same runs)."""
    import os

    os.environ["PATH"] = "/usr/bin:/bin"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        uri = restore(folder)
        ids = json.loads(IDS.read_text())
        for name in sorted(COMMANDS):
            (EXPECTED / f"{name}.txt").write_text(run_command(name, uri, folder, ids), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] not in (["--record"], ["--expected-only"]):
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _record() if sys.argv[1:] == ["--record"] else _expected_only()
