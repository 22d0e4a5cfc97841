"""manifest.json: every file a cycle found, where it went, and how to open it in Neuron Explorer."""

from __future__ import annotations

import shlex

from . import layout
from .output_files import UPLOAD, FoundFile


def manifest(
    found: list[FoundFile],
    *,
    neuron_dir: str,
    output_dir: str | None,
    trace_source: str | None,
    max_file_bytes: int | None,
    rank: int,
    attribution: dict | None = None,
) -> dict:
    """manifest.json: where the cycle's files went, each NTFF with its NEFF; with `attribution`
    (ingest: how device events were linked to ops, and how much device time no op carries)."""
    views = neuron_explorer_views(found, neuron_dir)
    neff_of = {pair["ntff"]: pair["neff"] for pair in views["neuron_pairs"]}
    files = []
    for f in found:
        entry = {
            "artifact_path": f"{neuron_dir}/{f.relative_path}",
            "source": str(f.path),
            "size_bytes": f.size_bytes,
            "uploaded": f.decision == UPLOAD,
            "reason": None if f.decision == UPLOAD else f.decision,
            "sha256": None,  # of the bytes uploaded, filled in by the uploader (_uploads.record_checksums)
        }
        if entry["artifact_path"] in neff_of:  # a device trace names the NEFF it can be read with
            entry["neff"] = neff_of[entry["artifact_path"]]
        files.append(entry)
    document = {
        "rank": rank,
        "profile_output_dir": output_dir,
        "max_file_bytes": max_file_bytes,
        "framework_trace": trace_source,
        "files": files,
        **views,
    }
    if attribution is not None:
        document["attribution"] = attribution
    return document


def neuron_explorer_views(found: list[FoundFile], neuron_dir: str) -> dict:
    """Each NTFF with its NEFF, and the `neuron-explorer view` command lines that open a pair or
    a session once `neuron_dir` is downloaded (`mlflow-neuron open`): paths are relative to it."""
    relative = [f.relative_path for f in found if not f.path.is_symlink()]
    pairs = layout.ntff_pairs(relative)
    sessions = layout.session_folders(relative)
    return {
        "neuron_views_relative_to": neuron_dir if pairs or sessions else None,
        "neuron_pairs": [
            {
                "ntff": f"{neuron_dir}/{ntff}",
                "neff": f"{neuron_dir}/{neff}" if neff else None,
                "view_command": shlex.join(layout.view_pair_command(neff, ntff)) if neff else None,
            }
            for ntff, neff in sorted(pairs.items())
        ],
        "neuron_sessions": [
            {
                "artifact_path": f"{neuron_dir}/{session}" if session else neuron_dir,
                "view_command": shlex.join(layout.view_session_command(session or ".")),
            }
            for session in sessions
        ],
    }
