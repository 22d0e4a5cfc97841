"""The end of a profile: one time budget, `flush_timeout_s`, from the last step to process exit.

Profiler stop, `close()` and interpreter exit share it: each waits only for what is left of it, and
what is not delivered within it stays in the outbox. A cycle that arrives later (training went on) gives
a later stop a whole budget again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._delivery.report import logger as _log


class ShutdownBudget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._waited = 0.0  # time flush points have waited since the last cycle

    def left(self, since: float | None = None) -> float:
        """Seconds left: the budget less what flush points waited (and, with `since`, a monotonic
        time, what the current one has waited so far)."""
        current = time.monotonic() - since if since is not None else 0.0
        return max(self.seconds - self._waited - current, 0.0)

    def renew(self) -> None:
        """Training went on: a later stop gets a whole budget again."""
        self._waited = 0.0

    @contextmanager
    def spending(self) -> Iterator[float]:
        """Counts the time spent inside against the budget; yields the monotonic start."""
        started = time.monotonic()
        try:
            yield started
        finally:
            self._waited += time.monotonic() - started


def flush_at_stop(producer: Any, budget: ShutdownBudget, reporter: Any) -> float:
    """Waits, for what is left of the budget, until this profile's cycles are delivered (the
    training process delivers too while it waits); what is not stays queued in the outbox, where
    the helper goes on with it, and `close()` says what is left. Returns the seconds this stop
    waited (logged at INFO level: what the profiler's exit cost the user)."""
    started, pending = time.monotonic(), producer.pending
    with budget.spending():
        try:
            producer.flush(budget.left())
            producer.say_refused()
        except Exception as error:  # noqa: BLE001
            reporter.problem("flush", "a pending cycle failed", error)
    waited = time.monotonic() - started
    _log.info("mlflow-neuron: the profiler's stop waited %.2f s (%d cycle(s) were pending)", waited, pending)
    return waited
