"""The outbox is private: 0700 folders, 0600 files, no symlinks or other users' folders, no credentials."""

import io
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from mlflow_neuron._delivery import outbox as _outbox
from mlflow_neuron._record.model import Delivery, RunRef
from mlflow_neuron.cli import exit_code, sync

URI_WITH_PASSWORD = "http://alice:s3cret-pw@127.0.0.1:5000"


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def a_delivery(tmp_path: Path) -> Delivery:
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "manifest.json").write_text("{}")
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "small.ntff").write_bytes(b"T" * 100)
    os.chmod(profile / "small.ntff", 0o644)
    return Delivery(step=4, timestamp_ms=1, artifact_dir="profiler/step_4", files_dir=str(staged),
                    uploads=((str(profile / "small.ntff"), "profiler/step_4/neuron"),))  # fmt: skip


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_outbox_is_0700_with_0600_files_and_no_credentials(tmp_path, umask_022):
    folder = tmp_path / "deep" / "outbox"
    record = _outbox.put(folder, a_delivery(tmp_path), RunRef(URI_WITH_PASSWORD, "r1"), copy_max_bytes=10)
    assert mode(folder) == 0o700 and mode(record) == 0o700
    assert mode(record / _outbox.RECORD) == 0o600
    for path in record.rglob("*"):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path
    text = (record / _outbox.RECORD).read_text()
    assert "s3cret-pw" not in text and "alice" not in text
    assert json.loads(text)["run"]["tracking_uri"] == "http://127.0.0.1:5000"
    _, run = _outbox.load(record)
    assert run.tracking_uri == "http://127.0.0.1:5000"  # the environment supplies credentials at sync


def test_a_hard_link_to_the_profilers_file_keeps_its_mode_inside_the_private_folder(tmp_path, umask_022):
    delivery = a_delivery(tmp_path)
    record = _outbox.put(tmp_path / "outbox", delivery, RunRef("sqlite:///x.db", "r1"), copy_max_bytes=10**6)
    linked = next(record.glob("uploads/*/small.ntff"))
    if os.lstat(linked).st_nlink == 1:  # the filesystem copied instead of linking
        assert mode(linked) == 0o600
    else:  # chmod would change the user's original; the 0700 folders keep others out
        assert mode(delivery.uploads[0][0]) == 0o644
        assert mode(linked.parent) == mode(linked.parent.parent) == 0o700


def test_an_own_outbox_made_by_an_older_version_is_tightened(tmp_path):
    folder = tmp_path / "outbox"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    _outbox.put(folder, a_delivery(tmp_path), RunRef("sqlite:///x.db", "r1"), copy_max_bytes=10)
    assert mode(folder) == 0o700


def test_a_symlinked_outbox_is_refused_never_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "outbox"
    link.symlink_to(target)
    with pytest.raises(_outbox.OutboxRefused, match="symbolic link"):
        _outbox.put(link, a_delivery(tmp_path), RunRef("sqlite:///x.db", "r1"), copy_max_bytes=10)
    assert list(target.iterdir()) == []
    err = io.StringIO()
    result = sync(str(link), out=io.StringIO(), err=err)
    assert tuple(result) == (0, 0) and exit_code(result) == 2
    assert "symbolic link" in err.getvalue() and list(target.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to make another user's folder")
def test_another_users_outbox_is_refused_for_writing_and_for_sync(tmp_path):
    folder = tmp_path / "outbox"
    folder.mkdir(mode=0o777)
    os.chown(folder, 65534, 65534)  # nobody
    with pytest.raises(_outbox.OutboxRefused, match="belongs to uid 65534"):
        _outbox.put(folder, a_delivery(tmp_path), RunRef("sqlite:///x.db", "r1"), copy_max_bytes=10)
    with pytest.raises(_outbox.OutboxRefused, match="belongs to uid 65534"):
        _outbox.pending(folder)


def test_the_temp_dir_fallback_is_per_user_and_0700(tmp_path, monkeypatch, umask_022):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fallback = _outbox.fallback_folder()
    assert fallback.name == f"mlflow-neuron-outbox-{os.getuid()}"
    _outbox.put(fallback, a_delivery(tmp_path), RunRef("sqlite:///x.db", "r1"), copy_max_bytes=10)
    assert mode(fallback) == 0o700


@pytest.mark.parametrize(
    "uri, stored",
    [
        ("http://u:p@host:5000/prefix", "http://host:5000/prefix"),
        ("https://token@host", "https://host"),
        ("http://host:5000", "http://host:5000"),
        ("databricks", "databricks"),
        ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
        ("postgresql://mlflow:pw@127.0.0.1:5432/db", "postgresql://127.0.0.1:5432/db"),
    ],
)
def test_credentials_are_dropped_from_stored_uris(uri, stored):
    assert _outbox.without_credentials(uri) == stored

