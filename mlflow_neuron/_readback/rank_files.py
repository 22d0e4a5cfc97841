"""A run's downloaded `profiler/ranks/` parsed: its node files (`_record.node_file`, one Parquet file
per node per cycle) and the JSON rank summaries of runs logged before them (one file per rank per
cycle). Read only, no MLflow.

    summaries, collectives, notes = parse_folder(folder)
    # summaries: every rank summary without its "collectives", in (rank, cycle) order
    # collectives: all their records as one table (`model.FRAME_COLUMNS`; "rank" and "cycle" say whose)

Each file is checked: one that is not a rank summary or node file of a version read here, or whose
content disagrees with its name, is left out and named in a note; a rank's cycle found twice is
read once. The others are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .._analysis.ranks.frames import collectives_frame
from .._record import node_file
from .._record.model import FRAME_COLUMNS, NODE_FILE_NAME, RANK_SUMMARY_NAME, RANKS_FOLDER, node_file_of, rank_summary_of
from .._trace.collectives import FORMAT, VERSION, VERSIONS_READ


def parse_folder(folder: Path) -> tuple[list[dict], pd.DataFrame, list[str]]:
    """(the rank summaries under a downloaded `profiler/ranks/`, without their collectives, in
    (rank, cycle) order; their collectives as one table; a note per file or summary left out)."""
    found, frames, notes, seen = [], [], [], set()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        summaries, frame, problem = _read(path, name)
        if problem:
            notes.append(f"{RANKS_FOLDER}/{name} left out: {problem}")
            continue
        kept = []
        for summary in summaries:
            key = (summary["rank"], summary["cycle_step"])
            if key in seen:
                notes.append(f"{RANKS_FOLDER}/{name}: rank {key[0]}, cycle {key[1]} left out: read from another file")
                continue
            seen.add(key)
            kept.append(summary)
        found += kept
        if len(kept) < len(summaries) and not frame.empty:
            wanted = {(s["rank"], s["cycle_step"]) for s in kept}
            frame = frame[[(r, c) in wanted for r, c in zip(frame["rank"], frame["cycle"])]]
        frames.append(frame)
    found.sort(key=lambda s: (s["rank"], s["cycle_step"]))
    frames = [f for f in frames if not f.empty]
    table = pd.concat(frames, ignore_index=True) if frames else collectives_frame([])
    return found, table[FRAME_COLUMNS], notes


def _read(path: Path, name: str) -> tuple[list[dict], pd.DataFrame | None, str | None]:
    """(summaries without collectives, their collectives) of one file, or ([], None, why it cannot be used)."""
    named = node_file_of(name)
    if named is not None:
        return _node_file(path, named[1])
    summary, problem = _json_summary(path, name)
    if problem:
        return [], None, problem
    frame = collectives_frame([summary])
    return [{k: v for k, v in summary.items() if k not in ("collectives", "member_sets")}], frame, None


def _node_file(path: Path, cycle: int) -> tuple[list[dict], pd.DataFrame | None, str | None]:
    try:
        summaries, frame = node_file.read(path)
    except (OSError, ValueError) as error:
        return [], None, str(error)
    for summary in summaries:
        problem = _summary_problem(summary)
        if problem is None and summary.get("cycle_step") != cycle:
            problem = f"it holds cycle {summary.get('cycle_step')!r}; its name says cycle {cycle}"
        if problem:
            return [], None, f"rank {summary.get('rank')!r}: {problem}"
    return summaries, frame, None


def _json_summary(path: Path, name: str) -> tuple[dict | None, str | None]:
    """(the summary, None), or (None, why it cannot be used)."""
    named = rank_summary_of(name)
    if named is None:
        return None, (f"not named {RANK_SUMMARY_NAME.format(rank='<r>', step='<step>')} nor "
                      f"{NODE_FILE_NAME.format(host='<host>', step='<step>', first='<r>')}")  # fmt: skip
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"not JSON ({error})"
    problem = _summary_problem(summary)
    if problem:
        return None, problem
    rank, cycle = named
    if summary.get("rank") != rank or summary.get("cycle_step") != cycle:
        return None, (f"it says rank {summary.get('rank')!r}, cycle {summary.get('cycle_step')!r}; its name says "
                      f"rank {rank}, cycle {cycle}")  # fmt: skip
    if not isinstance(summary.get("collectives"), list):
        return None, "no steps or collectives lists"
    return summary, None


def _summary_problem(summary) -> str | None:
    if not isinstance(summary, dict) or summary.get("format") != FORMAT:
        return f"not a rank summary (format is not {FORMAT!r})"
    if summary.get("version") not in VERSIONS_READ:
        return f"format version {summary.get('version')!r}, this mlflow-neuron reads {VERSION}"
    if not isinstance(summary.get("rank"), int) or not isinstance(summary.get("cycle_step"), int):
        return "no rank or cycle"
    if not isinstance(summary.get("steps"), list):
        return "no steps or collectives lists"
    return None
