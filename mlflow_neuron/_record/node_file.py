"""A node's file: every local rank's summary of one cycle in one Parquet file (`model.NODE_FILE`).

    the table: one row per collective record of every rank in the file, `model.FRAME_COLUMNS`
        rank, cycle, name, group, members (its group: an index into "member_sets", or null), desc,
        seq, step, start_us, end_us, bytes, peer, peer_index, lane, unplaced
    its key-value metadata, METADATA_KEY: one JSON text
        {"format": NODE_FORMAT, "version": NODE_VERSION, "host": ..., "cycle_step": ...,
         "member_sets": [[global ranks of a group], ...] (each group of the file once),
         "ranks": [{"summary": the rank's summary without "collectives" and its own "member_sets",
                               each of its "groups" with its "ranks" as an index into "member_sets",
                    "manifest": the manifest of a rank that uploaded nothing of its own, or null}, ...]}

Version 1 (read still) wrote each record's group as its list of ranks, and each process group's
ranks in full: 100 million numbers a cycle at 4,096 ranks, where version 2 writes a few thousand
(`member_column`).

A rank summary is the `_trace.collectives` format (docs/ranks.md); split this way its records are
columns a reader loads without a pass over them in Python, and the rest stays as the rank wrote
it. The node's consumer writes the file (`_delivery.node_parts`); `read` gives back the
summaries (without their `collectives`) and the records as one table. pyarrow (MLflow's own
dependency) is imported on first use.
"""

from __future__ import annotations

import math
from pathlib import Path

from .._trace.json_text import dumps, parse
from .member_column import FileSets, checked_lists, listed_member_tuples, member_tuples, restored_groups
from .model import FRAME_COLUMNS

NODE_FORMAT = "mlflow-neuron/node-ranks"
NODE_VERSION = 2
VERSIONS_READ = (1, 2)
METADATA_KEY = b"mlflow_neuron.ranks"
_INTS = ("rank", "cycle", "seq", "step", "bytes", "peer", "peer_index")
_FLOATS = ("start_us", "end_us")
_TEXTS = ("name", "group", "desc", "unplaced")


def write(ranks: list[dict], path: str | Path, *, host: str | None, cycle_step: int) -> None:
    """Writes the node's file of one cycle: `ranks` are {"summary": a rank summary (with its
    `collectives`), "manifest": dict or None}, in rank order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list] = {name: [] for name in FRAME_COLUMNS}
    kept, file_sets = [], FileSets()
    for part in ranks:
        summary = dict(part["summary"])
        records = [r for r in summary.pop("collectives", None) or [] if isinstance(r, dict)]
        sets = summary.pop("member_sets", None) or []  # a record's `members` may index these
        codes = [file_sets.index(_members(ranks, [])) for ranks in sets]  # each of them once, not once a record
        cycle = summary.get("cycle_step") if isinstance(summary.get("cycle_step"), int) else cycle_step
        columns["rank"] += [summary.get("rank")] * len(records)
        columns["cycle"] += [cycle] * len(records)
        for name in FRAME_COLUMNS[2:]:
            columns[name] += [_member_code(r.get(name), codes, file_sets) if name == "members" else r.get(name)
                              for r in records]  # fmt: skip
        if "groups" in summary:
            summary["groups"] = file_sets.groups(summary["groups"])
        kept.append({"summary": summary, "manifest": part.get("manifest")})
    arrays = {name: pa.array([_int(v) for v in columns[name]], pa.int64()) for name in (*_INTS, "members")}
    arrays.update({name: pa.array([_float(v) for v in columns[name]], pa.float64()) for name in _FLOATS})
    arrays.update({name: pa.array([None if v is None else str(v) for v in columns[name]], pa.string())
                   for name in _TEXTS})  # fmt: skip
    arrays["lane"] = _lanes(columns["lane"])
    meta = {"format": NODE_FORMAT, "version": NODE_VERSION, "host": host, "cycle_step": cycle_step,
            "member_sets": file_sets.lists, "ranks": kept}  # fmt: skip
    table = pa.table([arrays[name] for name in FRAME_COLUMNS], names=FRAME_COLUMNS)
    table = table.replace_schema_metadata({METADATA_KEY: dumps(meta)})  # a NaN stays NaN, as in a rank's JSON
    pq.write_table(table, str(path), compression="zstd")


def read(path: str | Path):
    """(the rank summaries, without `collectives`, in the file's order; their collectives as one
    DataFrame of FRAME_COLUMNS, `members` as tuples or None). ValueError saying why for a
    file that is not a node's file of a version read here."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(str(path))
    except Exception as error:  # noqa: BLE001 - pyarrow's errors: not Parquet, cut short
        raise ValueError(f"not a Parquet file ({type(error).__name__}: {error})") from None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ValueError(f"no {METADATA_KEY.decode()} metadata: not a node's file")
    try:
        meta = parse(raw)
    except ValueError as error:
        raise ValueError(f"its {METADATA_KEY.decode()} metadata is not JSON ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != NODE_FORMAT:
        raise ValueError(f"not a node's file (format is not {NODE_FORMAT!r})")
    if meta.get("version") not in VERSIONS_READ:
        raise ValueError(f"node file version {meta.get('version')!r}, this mlflow-neuron reads "
                         f"{' and '.join(map(str, VERSIONS_READ))}")  # fmt: skip
    missing = [name for name in FRAME_COLUMNS if name not in table.column_names]
    ranks = meta.get("ranks")
    if missing or not isinstance(ranks, list) or not all(isinstance(r, dict) and isinstance(r.get("summary"), dict)
                                                         for r in ranks):  # fmt: skip
        raise ValueError(f"its columns or rank list are not a node's file's (missing: {', '.join(missing) or 'none'})")
    frame = table.select([name for name in FRAME_COLUMNS if name != "members"]).to_pandas()
    if meta["version"] == 1:
        frame.insert(FRAME_COLUMNS.index("members"), "members", listed_member_tuples(table.column("members")))
        return [r["summary"] for r in ranks], frame
    lists = checked_lists(meta.get("member_sets"))
    frame.insert(FRAME_COLUMNS.index("members"), "members", member_tuples(lists, table.column("members")))
    return [{**r["summary"], "groups": restored_groups(r["summary"]["groups"], lists)} if "groups" in r["summary"]
            else r["summary"] for r in ranks], frame  # fmt: skip


def _int(value) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, float) and math.isfinite(value) and value.is_integer() else None


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _members(value, sets: list) -> list[int] | None:
    """A record's group as its ranks: `members` itself, or its index into the summary's `member_sets`."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = sets[value] if 0 <= value < len(sets) else None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(type(v) is int for v in value):  # as a summary has them: no call a rank
        return list(value)
    ranks = [_int(v) for v in value]
    return None if any(r is None for r in ranks) else ranks


def _member_code(value, codes: list, file_sets: FileSets) -> int | None:
    """A record's group as its index into the file's groups (`codes`: the summary's `member_sets`'
    indexes there)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return codes[value] if 0 <= value < len(codes) else None
    return file_sets.index(_members(value, []))


def _lanes(values: list):
    """The records' threads: integers where every one is (a trace's `tid` is), else text."""
    import pyarrow as pa

    if all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
        return pa.array(values, pa.int64())
    return pa.array([None if v is None else str(v) for v in values], pa.string())
