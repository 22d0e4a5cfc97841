"""Operator names made into legal, stable, collision-free MLflow metric keys.

Profiler names break MLflow's key rules (`ProfilerStep*`, `Optimizer.step#SGD.step`, kernel names
with `<>(),` and unicode). The readable form is kept when it is unambiguous; a name that would
share a key with another gets a suffix derived from its own text, so the same name always gets
the same key whatever else a cycle holds, and the original names stay in `ops.json`.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "profiler"
NEURON_SUMMARY_PREFIX = "neuron/summary"  # Neuron Explorer's summary of a cycle's capture sessions
MAX_OP_KEY_CHARS = 150  # leaves room for `profiler/rank_<r>/self_device_time_us/` under MLflow's 250

_ILLEGAL = re.compile(r"[^A-Za-z0-9_.\-]")
_DOT_RUN = re.compile(r"\.{2,}")
_HASH_CHARS = 8


def name_hash(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]


def readable_key(name: str) -> str:
    """`aten::mul` -> `aten.mul`; other characters outside `[A-Za-z0-9_.-]` become `_`."""
    key = _ILLEGAL.sub("_", name.replace("::", "."))
    # `..` and keys made only of dots are path tricks that MLflow rejects.
    key = _DOT_RUN.sub(lambda run: "_" * len(run.group()), key)
    if not key or key.strip(".") == "":
        key = "_" * max(len(key), 1)
    if len(key) > MAX_OP_KEY_CHARS:
        key = f"{key[: MAX_OP_KEY_CHARS - _HASH_CHARS - 1]}-{name_hash(name)}"
    return key


class OpKeys:
    """Remembers which name owns which key, so keys stay stable across a run's cycles."""

    def __init__(self) -> None:
        self._key_of: dict[str, str] = {}
        self._owner_of: dict[str, str] = {}

    def key(self, name: str) -> str:
        known = self._key_of.get(name)
        if known is not None:
            return known
        key = readable_key(name)
        if key in self._owner_of:
            key = f"{key[: MAX_OP_KEY_CHARS - _HASH_CHARS - 1]}-{name_hash(name)}"
        suffix = 0
        while key in self._owner_of:  # a hash clash, in practice never
            suffix += 1
            key = f"{key}-{suffix}"
        self._key_of[name] = key
        self._owner_of[key] = name
        return key

    def known(self) -> dict[str, str]:
        """Every name -> key handed out so far."""
        return dict(self._key_of)

    def adopt(self, known: dict[str, str]) -> None:
        """Takes keys handed out elsewhere for the same run, where they clash with none here."""
        for name, key in known.items():
            if name not in self._key_of and key not in self._owner_of:
                self._key_of[name] = key
                self._owner_of[key] = name

    def keys(self, names: list[str]) -> dict[str, str]:
        """Keys for `names`; sorted first so the outcome does not depend on their order."""
        return {name: self.key(name) for name in sorted(names)}


def metric_key(kind: str, op_key: str, rank_prefix: str = "") -> str:
    return f"{PREFIX}/{rank_prefix}{kind}/{op_key}"


def total_key(kind: str, rank_prefix: str = "") -> str:
    return f"{PREFIX}/{rank_prefix}total/{kind}"
