"""The process groups of a node file (`node_file`): each group's ranks written once a file, and read
back as one Python object a group.

    sets = FileSets()
    sets.index([0, 1, 2, 3])            # 0: a record's `members` column holds this index
    sets.groups(summary["groups"])      # the summary's process groups, each `ranks` as its index
    sets.lists                          # written once, in the file's metadata ("member_sets")

    member_tuples(sets.lists, table.column("members"))     # version 2: tuple or None a row
    listed_member_tuples(table.column("members"))          # version 1: the lists themselves

A job holds few groups, each named thousands of times: at 4,096 ranks the world group is 4,096
ranks long, and every rank lists it among its process groups and names it on every world
collective. Written out each time, that is 100 million numbers a cycle; written once a file, it is
a few thousand. Read back, rows of one group share one tuple (`_analysis.ranks.matching.
intern_members` then hashes each group once) and summaries one list.
"""

from __future__ import annotations

import numpy as np


class FileSets:
    """The distinct groups of one file, in the order first seen."""

    def __init__(self) -> None:
        self.lists: list[list[int]] = []
        self._index: dict[tuple, int] = {}

    def index(self, ranks: list[int] | None) -> int | None:
        if ranks is None:
            return None
        key = tuple(ranks)
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = len(self.lists)
            self.lists.append(list(key))
        return found

    def groups(self, groups):
        """A summary's `groups` (its process groups) with each list of `ranks` as its index."""
        if not isinstance(groups, list):
            return groups
        return [{**g, "ranks": self.index(g["ranks"])} if isinstance(g, dict) and _ranks(g.get("ranks")) else g
                for g in groups]  # fmt: skip


def restored_groups(groups, lists: list[list[int]]):
    """`FileSets.groups` undone: each index back to its list (one list object a group)."""
    if not isinstance(groups, list):
        return groups
    out = []
    for g in groups:
        if isinstance(g, dict) and isinstance(g.get("ranks"), int) and not isinstance(g["ranks"], bool):
            if not 0 <= g["ranks"] < len(lists):
                raise ValueError(f"a process group's ranks index {g['ranks']} is not one of the file's {len(lists)} groups")
            g = {**g, "ranks": lists[g["ranks"]]}
        out.append(g)
    return out


def checked_lists(value) -> list[list[int]]:
    """The file's `member_sets`, or ValueError."""
    if not isinstance(value, list) or not all(_ranks(v) for v in value):
        raise ValueError("its member_sets are not lists of ranks")
    return value


def member_tuples(lists: list[list[int]], column) -> np.ndarray:
    """A version 2 `members` column (an index into `lists`, or null) as an object array: a tuple
    of ranks a row, shared by the rows of one group, or None."""
    import pyarrow.compute as pc

    codes = np.asarray(pc.fill_null(column, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    if len(codes) and (codes.min() < -1 or codes.max() >= len(lists)):
        raise ValueError(f"a members index is not one of the file's {len(lists)} groups")
    shared = np.empty(len(lists) + 1, dtype=object)  # the last: None, for -1
    for i, ranks in enumerate(lists):
        shared[i] = tuple(ranks)
    return shared[codes]


def listed_member_tuples(column) -> np.ndarray:
    """A version 1 `members` column (list<int64>: each row its group's ranks) as an object array:
    a tuple of ints a row, () for an empty list, None for a null; rows with equal lists share one
    tuple. Each row's list is a view of its bytes in the column's own buffer, the distinct ones are
    found by Arrow (`dictionary_encode`), and only those made into tuples."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    out = np.full(len(array), None, dtype=object)
    if len(array) == 0:
        return out
    values = array.values.cast(pa.int64())  # the whole child array; `offsets` index into it
    starts = (np.asarray(array.offsets, dtype=np.int64) + values.offset) * 8
    as_bytes = pa.Array.from_buffers(pa.large_binary(), len(array), [None, pa.py_buffer(starts), values.buffers()[1]])
    encoded = pc.dictionary_encode(as_bytes)
    distinct = np.empty(len(encoded.dictionary), dtype=object)
    for i, raw in enumerate(encoded.dictionary.to_pylist()):
        distinct[i] = tuple(np.frombuffer(raw, dtype=np.int64).tolist())
    valid = ~np.asarray(array.is_null(), dtype=bool)
    out[valid] = distinct[np.asarray(encoded.indices, dtype=np.int64)[valid]]
    return out


def _ranks(value) -> bool:
    """Whether `value` is a list of ints (looked at in NumPy: a world group is thousands long)."""
    if not isinstance(value, list):
        return False
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):  # ragged
        return False
    return not value or (array.ndim == 1 and array.dtype.kind == "i")
