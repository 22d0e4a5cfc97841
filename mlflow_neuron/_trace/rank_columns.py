"""The rank summary's events taken from the columns that a cycle's reader made of them
(`chrome_file.ReadPiece`), so that a cycle's events are walked once. Pure.

`feed_columns(events, piece)` keeps in `events` (a `collectives.RankEvents`) exactly what
`events.feed(piece.events)` keeps: cpu ops, device events and launches come from the columns; the
few events that name a step or a collective (`rank_roles.name_flag`), and those that made no row
(memory, hidden, categories the reader does not take), go through `feed`, in their order. Where
one of those would add to the lists the columns fill (a category the reader does not know, a
hidden op), the whole piece goes through `feed`.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from .rank_roles import ANNOTATION, CPU_OP, DEVICE, LAUNCH, MARKED, PLAIN, device_class, name_flag, role_of

_NO_ARGS: dict = {}


def feed_columns(events, piece) -> None:
    """`events.feed(piece.events)`, from `piece`'s columns (the module docstring)."""
    rows, offset, roles = piece.columns, piece.offset, events.roles
    for index in piece.aside:
        event = piece.events[index - offset]
        if event.get("ph") == "X":
            category = event.get("cat") or ""
            role = roles.get(category)
            if role is None:
                role = roles[category] = role_of(category)
            if role in (CPU_OP, DEVICE, LAUNCH):
                events.feed(piece.events)
                return
    if rows is None:
        events.feed([piece.events[i - offset] for i in piece.aside])
        return
    role, flag = _kind_roles(piece.categories)[rows["kind"]], _flags(events, piece.names)[rows["name"]]
    start = rows["ts"].astype(np.float64)
    end = start + (rows["dur"].astype(np.float64) + 0.0)  # as `feed`'s `dur or 0.0`: a -0.0 duration adds 0.0
    cpu = role == CPU_OP
    plain = cpu & (flag == PLAIN)
    events.cpu_ops.extend(zip(start[plain].tolist(), end[plain].tolist()))
    device = np.flatnonzero(role == DEVICE)
    if len(device):
        _device_rows(events, piece, device, start, end)
    launch = np.flatnonzero(role == LAUNCH)
    if len(launch):
        _launches(events, piece, launch, start)
    marked = (cpu & (flag != PLAIN)) | ((role == ANNOTATION) & (flag == MARKED))
    walked = sorted(piece.aside + rows["source"][marked].tolist())
    if walked:
        events.feed([piece.events[i - offset] for i in walked])


@functools.cache
def _kind_roles(categories: tuple[str, ...]) -> np.ndarray:
    """Each kind's role (`role_of` its category), worked out once, not at every piece."""
    return np.array([role_of(c) for c in categories], np.int8)


def _flags(events, names: dict) -> np.ndarray:
    """Each name id's `name_flag`, the new names' worked out once."""
    if len(events.name_list) < len(names):
        new = list(itertools.islice(names, len(events.name_list), None))
        events.name_list.extend(new)
        events.name_flags = np.concatenate([events.name_flags, np.array([name_flag(n) for n in new], np.int8)])
    return events.name_flags


def _device_rows(events, piece, device: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    """The device events among a piece's rows, as `feed` keeps them; each (category, name)
    classified once."""
    rows, names, width = piece.columns, events.name_list, len(events.name_list) + 1
    pairs, which = np.unique(rows["kind"][device] * width + rows["name"][device], return_inverse=True)
    known = []
    for pair in pairs.tolist():
        key = (piece.categories[pair // width], names[pair % width])
        found = events.classes.get(key)
        if found is None:
            found = events.classes[key] = device_class(*key)
        known.append(found)
    kinds = np.array([k for k, _ in known], np.int64)[which]
    keep = np.array([k for _, k in known], bool)[which]
    correlation = rows["correlation"][device].tolist()
    sources = (rows["source"][device] - piece.offset).tolist()
    args: list = [_NO_ARGS] * len(device)
    for position in np.flatnonzero(keep).tolist():
        event = piece.events[sources[position]]
        args[position] = {**(event.get("args") or {}), "_name": event["name"]}
    for position in np.flatnonzero(rows["correlation"][device] == 0).tolist():  # absent, null or 0
        correlation[position] = (piece.events[sources[position]].get("args") or {}).get("correlation")
    events.device.extend(zip(start[device].tolist(), end[device].tolist(), kinds.tolist(), correlation, args))


def _launches(events, piece, launch: np.ndarray, start: np.ndarray) -> None:
    """Each launch's correlation id -> its start, as `feed` keeps them (none for an absent or null id)."""
    correlation = piece.columns["correlation"][launch]
    known = correlation != 0
    events.launches.update(zip(correlation[known].tolist(), start[launch[known]].tolist()))
    for i, ts in zip(piece.columns["source"][launch[~known]].tolist(), start[launch[~known]].tolist()):
        value = (piece.events[i - piece.offset].get("args") or {}).get("correlation")  # None (absent, null) or 0
        if value is not None:
            events.launches[value] = ts
