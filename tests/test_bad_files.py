"""Every command that reads a file, against a corpus of bad files: one line on stderr and exit 2,
never a traceback, never 70 (a bug) or 1 (a regression, to a CI job). Issue 35, item 5.

The commands that take a path (`mlflow-neuron --help`): `ingest PATH` reads traces, `sync --outbox
DIR` reads an outbox's entries. The corpus is made here, a few KiB each, not kept in git.
"""

from __future__ import annotations

import gzip
import json
import os
import warnings
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mlflow_neuron.cli import main as cli_main

EXIT_USAGE, EXIT_FAILED = 2, 1
DEEP = 200_000


def _event(**fields) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, **fields}


def _trace(*events: dict) -> bytes:
    return json.dumps({"traceEvents": list(events)}).encode()


def _one(raw_event: str) -> bytes:
    """A trace of one event written by hand: JSON that `json.dumps` would not write."""
    return b'{"traceEvents": [' + raw_event.encode() + b"]}"


def bad_files() -> dict[str, bytes]:
    """Name -> bytes of each file `ingest` must refuse, with the reason in one line."""
    whole = gzip.compress(_trace(*(_event(ts=10.0 + i) for i in range(200))))
    corrupt = bytearray(whole)
    corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 2] = bytes(b ^ 0xFF for b in corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 2])
    bad_crc = bytearray(whole)
    bad_crc[-6] ^= 0xFF
    event = '{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,'
    return {
        "empty.json": b"",
        "junk.json": os.urandom(4096),
        "junk.json.gz": os.urandom(4096),
        "truncated.json.gz": whole[: len(whole) // 2],
        "corrupt.json.gz": bytes(corrupt),
        "bad_crc.json.gz": bytes(bad_crc),
        "not_gzip.json.gz": b"plain text",
        "truncated.json": _trace(_event(), _event())[:-20],
        "deep_array.json": b"[" * DEEP + b"]" * DEEP,
        "deep_trace.json": b'{"traceEvents": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        "deep_args.json": _one(event + '"ts":1,"dur":1,"args":' + '{"a":' * DEEP + "1" + "}" * (DEEP + 1)),
        "nan_string_ts.json": _trace(_event(ts="NaN")),
        "nan_ts.json": _one(event + '"ts":NaN,"dur":1}'),
        "infinite_dur.json": _one(event + '"ts":1,"dur":Infinity}'),
        "negative_dur.json": _trace(_event(dur=-5.0)),
        "negative_ts.json": _trace(_event(ts=-1e9)),
        "huge_ts.json": _trace(_event(ts=1e300)),
        "huge_int_dur.json": _one(event + '"ts":1,"dur":' + "9" * 30 + "}"),
        "400_digit_ts.json": _one(event + '"ts":1' + "0" * 400 + ',"dur":1}'),
        "5000_digit_ts.json": _one(event + '"ts":' + "9" * 5000 + ',"dur":1}'),
        "huge_id.json": _one(event + '"ts":1,"dur":1,"args":{"External id":' + str(2**63 + 5) + "}}"),
        "name_a_number.json": _trace(_event(name=5)),
        "ts_a_list.json": _trace(_event(ts=[1])),
        "tid_an_object.json": _trace(_event(), _event(tid={"a": 1}, pid=[1])),
        "cat_a_list.json": _trace(_event(cat=["cpu_op"])),
        "id_a_string.json": _trace(_event(), _event(cat="kernel", args={"External id": "x"})),
        "events_an_object.json": json.dumps({"traceEvents": {"a": 1}}).encode(),
        "events_not_objects.json": json.dumps({"traceEvents": [1, "x", None]}).encode(),
        "top_level_array.json": b"[1, 2, 3]",
        "no_events.json": _trace(),
        "not_utf8.json": b'{"traceEvents": [{"name": "\xff\xfe"}]}',
    }


# Optional fields of the wrong type: what can be read is read, and the rest left out (exit 0).
ODD_BUT_READABLE = {
    "odd_shapes.json": _trace(_event(name="aten::mm", args={"Input Dims": 5, "Input type": [["float"], {"a": 1}],
                                                            "Concrete Inputs": {"a": 1}})),  # fmt: skip
    "odd_memory_event.json": _trace(_event(), {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12.0,
                                               "args": {"Bytes": 1e300, "Device Type": "x"}}),  # fmt: skip
    "odd_header.json": json.dumps({"traceEvents": [_event()], "baseTimeNanoseconds": [1], "deviceProperties": "x"}).encode(),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad_files")
    for name, data in {**bad_files(), **ODD_BUT_READABLE}.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, Path]:
    """One sqlite store for the module (each bad file is refused before a run is made) and a folder
    to run in, where artifacts of the readable ones land."""
    folder = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # the store's default artifact root, ./mlruns, lands there
        MlflowClient(uri).search_experiments()  # made now: its creation's INFO lines are not the command's
    return uri, folder


def run_cli(argv: list[str], capsys) -> tuple[int, str, str, list]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = cli_main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    out, err = capsys.readouterr()
    ours = [w for w in caught if "mlflow_neuron" in str(w.filename)]
    return code, out, err, ours


def assert_refused_in_one_line(code: int, err: str, ours: list, command: str) -> None:
    lines = err.strip().splitlines()
    assert code == EXIT_USAGE, err
    assert len(lines) == 1 and lines[0].startswith(f"mlflow-neuron {command}: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    assert not ours, [str(w.message) for w in ours]


@pytest.mark.parametrize("name", sorted(bad_files()))
def test_ingest_refuses_a_bad_file_in_one_line(name, corpus, store, capsys, monkeypatch):
    uri, folder = store
    monkeypatch.chdir(folder)
    code, _, err, ours = run_cli(["ingest", str(corpus / name), "--tracking-uri", uri, "--experiment", "bad"], capsys)
    assert_refused_in_one_line(code, err, ours, "ingest")


@pytest.mark.parametrize("name", ["deep_trace.json", "corrupt.json.gz", "tid_an_object.json"])
def test_ingest_refuses_a_bad_trace_inside_a_folder_in_one_line(name, corpus, store, capsys, monkeypatch, tmp_path):
    """The same reader behind a Neuron output folder and a tensorboard folder."""
    uri, folder = store
    monkeypatch.chdir(folder)
    neuron = tmp_path / "neuron" / "i-0_pid_1" / "20260101T000000"
    neuron.mkdir(parents=True)
    (neuron / "trace.json").write_bytes((corpus / name).read_bytes() if not name.endswith(".gz") else gzip.compress(b"{"))
    tensorboard = tmp_path / "tb"
    tensorboard.mkdir()
    suffix = ".pt.trace.json.gz" if name.endswith(".gz") else ".pt.trace.json"
    (tensorboard / f"host_1.1{suffix}").write_bytes((corpus / name).read_bytes())
    for path in (tmp_path / "neuron", tensorboard):
        code, _, err, ours = run_cli(["ingest", str(path), "--tracking-uri", uri, "--experiment", "bad"], capsys)
        assert_refused_in_one_line(code, err, ours, "ingest")


@pytest.mark.parametrize("name", sorted(ODD_BUT_READABLE))
def test_ingest_reads_what_it_can_of_odd_optional_fields(name, corpus, store, capsys, monkeypatch):
    uri, folder = store
    monkeypatch.chdir(folder)
    code, out, err, ours = run_cli(["ingest", str(corpus / name), "--tracking-uri", uri, "--experiment", "odd"], capsys)
    assert code == 0 and "ingested 1 cycle(s)" in out, err
    assert not ours, [str(w.message) for w in ours]


def test_sync_refuses_a_file_for_an_outbox_in_one_line(corpus, capsys):
    for name in ("deep_array.json", "junk.json.gz", "empty.json"):
        code, _, err, ours = run_cli(["sync", "--outbox", str(corpus / name)], capsys)
        assert_refused_in_one_line(code, err, ours, "sync")


@pytest.mark.parametrize("name", ["deep_trace.json", "deep_args.json", "junk.json", "empty.json", "nan_ts.json",
                                  "5000_digit_ts.json", "top_level_array.json", "not_utf8.json"])  # fmt: skip
def test_sync_sets_aside_an_entry_whose_job_file_is_bad(name, corpus, store, capsys, tmp_path):
    """An outbox entry whose job.json is a bad file is damaged: set aside, named, exit 1 (sync's
    "records were kept or found damaged"), never a traceback or 70."""
    uri, _ = store
    entry = tmp_path / "outbox" / "entry-1"
    entry.mkdir(parents=True)
    (entry / "job.json").write_bytes((corpus / name).read_bytes())
    code, out, err, ours = run_cli(["sync", "--outbox", str(tmp_path / "outbox"), "--tracking-uri", uri], capsys)
    assert code == EXIT_FAILED, out + err
    assert "entry-1: its job.json cannot be read" in out + err and "Traceback" not in out + err
    assert (tmp_path / "outbox" / "damaged" / "entry-1").is_dir()
    assert not ours, [str(w.message) for w in ours]
