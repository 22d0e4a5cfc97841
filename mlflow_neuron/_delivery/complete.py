"""A cycle's numbers become a record's metrics, tables, series and tags: one code for both paths.

The callback (in-process path) and the helper process (`_helper.py`) each hold one `Completer`
per run: it keeps the op-key registry (so an op keeps its key across cycles) and whether device
time was seen, and it reports what looks wrong through the reporter it is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._neuron import devices as _devices
from .._delivery import record as _record
from .._trace.function_events import MISSING, PRESENT, CycleProfile
from .._delivery.keys import OpKeys


class Completer:
    def __init__(self, reporter, *, top_k: int, rank: int, primary: bool, all_ranks: bool) -> None:
        self.reporter = reporter
        self.top_k = top_k
        self.rank = rank
        self.primary = primary
        self.all_ranks = all_ranks
        self.keys = OpKeys()
        self.last_profile: CycleProfile | None = None
        self._device_time_seen = False
        self._lock = threading.Lock()  # the sender, or close() storing a record, complete records

    def complete(
        self, summarize: Callable[[], tuple[CycleProfile, str, Any]], device: str, record: _record.CycleRecord,
    ) -> None:  # fmt: skip
        """Fills in a record's numbers, tables and tags; runs in the sender, one record at a time."""
        with self._lock:
            try:
                profile, record.key_averages, record.timeline = summarize()
            except Exception as error:  # noqa: BLE001 - the cycle's files and trace still go
                self.reporter.problem("events", "the cycle's events could not be read (per-op metrics are empty)", error)
                profile = empty_profile(device)
                record.key_averages = ""
            self.last_profile = profile
            if profile.device_time == MISSING:
                self.reporter.problem(
                    "device_time_missing", _devices.MISSING_DEVICE_TIME_HINT.format(device=device)
                )
            record.metrics = self.metrics(profile)
            record.ops_table = _record.ops_table(profile, self.keys)
            record.step_tables = _record.step_tables(profile)
            record.series = self.series(profile)
            if self.primary:
                self._device_time_seen |= profile.device_time == PRESENT
                record.tags = {
                    _record.DEVICE_TAG: device,
                    _record.DEVICE_TIME_TAG: PRESENT if self._device_time_seen else profile.device_time,
                }

    def export(self) -> dict:
        """What a Completer in another process must know to go on where this one is: the op keys
        handed out (an op keeps its key across cycles) and whether device time was seen."""
        with self._lock:
            return {"keys": self.keys.known(), "device_time_seen": self._device_time_seen}

    def absorb(self, known: dict) -> None:
        """Takes what another Completer of the same run `export`ed."""
        with self._lock:
            self.keys.adopt(known.get("keys") or {})
            self._device_time_seen |= bool(known.get("device_time_seen"))

    def metrics(self, profile: CycleProfile) -> dict[str, float]:
        metrics = {}
        if self.primary:
            metrics.update(_record.cycle_metrics(profile, self.keys, self.top_k))
        if self.all_ranks:
            metrics.update(_record.cycle_metrics(profile, self.keys, self.top_k, f"rank_{self.rank}/"))
        finite, dropped = _record.split_non_finite(metrics)
        if dropped:
            self.reporter.problem(
                "non_finite", f"{len(dropped)} metric(s) were NaN or infinite and not logged (first: {dropped[0]}); "
                "ops.json keeps the raw values",
            )  # fmt: skip
        return finite

    def series(self, profile: CycleProfile) -> tuple[tuple[str, float, int], ...]:
        series = _record.step_series(profile) if self.primary else ()
        if self.all_ranks:
            series += _record.step_series(profile, f"rank_{self.rank}/")
        return series


def guarded_timeline(reporter, step: int, build: Callable[[], Any]) -> Any:
    """The cycle's span tree; None (one warning) when it cannot be built: the rest still goes."""
    try:
        return build()
    except Exception as error:  # noqa: BLE001
        reporter.problem("timeline", f"profiler step {step} has no timeline (its trace is not logged)", error)
        return None


def empty_profile(device: str) -> CycleProfile:
    from .._trace.aggregate import aggregate
    from .._trace.events import empty_events

    return aggregate(empty_events(None), device=device, device_profiled=device != _devices.CPU)
