"""The uploader's pieces without a server: the hashing request body, progress lines, the manifest."""

import hashlib
import json
import os

from mlflow_neuron._delivery.uploads import HashingReader, Progress, Sent, file_sha256, manifest_with_checksums


def test_the_request_body_hashes_what_it_hands_out_and_starts_over_when_rewound(tmp_path):
    data = os.urandom(3 * 1024**2 + 17)
    path = tmp_path / "x.ntff"
    path.write_bytes(data)
    body = HashingReader(str(path), len(data))
    assert len(body) == len(data)
    body.read(8192)
    body.seek(0)  # urllib3 rewinds a body it sends again
    sent = b"".join(iter(lambda: body.read(8192), b""))
    digest = body.hexdigest()
    body.close()
    assert sent == data and body.sent == len(data)
    assert digest == hashlib.sha256(data).hexdigest() == file_sha256(path)


def test_progress_lines_are_rate_limited_and_the_last_one_is_said_once():
    lines = []
    progress = Progress("neuron/x.ntff", 4 * 1024**3, lines.append, every_s=3600)
    for done in range(0, 4 * 1024**3 + 1, 1024**3):
        progress.update(done)
    progress.update(4 * 1024**3)
    assert len(lines) == 1 and lines[0].startswith("uploading neuron/x.ntff: 4.00 of 4.00 GiB (100%)")


def test_the_manifest_gets_what_was_sent_and_notes_a_file_rewritten_since_the_cycle(tmp_path):
    manifest = {"files": [{"artifact_path": "n/a.ntff", "size_bytes": 10, "sha256": None},
                          {"artifact_path": "n/b.ntff", "size_bytes": 5, "sha256": None}]}  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    sent = {"n/a.ntff": Sent("n/a.ntff", 10, "aa"), "n/b.ntff": Sent("n/b.ntff", 7, "bb")}
    a, b = json.loads(manifest_with_checksums(tmp_path, sent))["files"]
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest  # sealed in a record: left as it is
    assert manifest_with_checksums(tmp_path, {}) is None
    assert a == {"artifact_path": "n/a.ntff", "size_bytes": 10, "sha256": "aa"}
    assert b == {"artifact_path": "n/b.ntff", "size_bytes": 7, "sha256": "bb", "size_bytes_at_cycle": 5}
