"""The end of a profile: one time budget, `flush_timeout_s`, from the last step to process exit.

Profiler stop, `close()` and interpreter exit share it: each waits only for what is left of it, and
what is not sent within it goes to the outbox. A cycle that arrives later (training went on) gives
a later stop a whole budget again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._delivery.handoff import Handoff
from .._delivery.report import logger as _log
from .._delivery.probe import check_reachable


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


def flush_at_stop(sender: Any, budget: ShutdownBudget, reporter: Any) -> float:
    """Waits for pending cycles for what is left of the budget; the rest goes to the outbox. Then
    the helper process, if any, ends: its profile is over. With `hands_over` the helper goes on
    instead (the next profile's cycles go to it too; `close()` lets it go), and only the cycles read
    in this process, if any, are waited for. Returns the seconds this stop waited (logged at INFO
    level: what the profiler's exit cost the user)."""
    started, pending = time.monotonic(), sender.pending
    helper = sender if isinstance(sender, Handoff) else None
    waited_for = helper.inner if helper is not None and helper.hands_over else sender
    with budget.spending():
        try:
            flushed = waited_for.flush(budget.left())
        except Exception as error:  # noqa: BLE001
            reporter.problem("flush", "a pending cycle failed", error)
            flushed = False
    try:
        if not flushed:
            waited_for.spill(f"it was not sent within flush_timeout_s={budget.seconds:g} s")
        if helper is not None and not helper.hands_over:
            with budget.spending():
                helper.retire(budget.left())
    except Exception as error:  # noqa: BLE001
        reporter.problem("flush", "could not store pending cycles in the outbox", error)
    waited = time.monotonic() - started
    _log.info("mlflow-neuron: the profiler's stop waited %.2f s (%d cycle(s) were pending%s)", waited, pending,
              "; the helper goes on delivering them" if waited_for is not sender else "")  # fmt: skip
    return waited


def end_run(logger: Any, seconds: float, reporter: Any, flush_timeout_s: float) -> bool:
    """Ends the run `logger` created, waiting at most `seconds` for the server; False if it could not."""
    run_id = logger.run.run_id
    if seconds <= 0:
        reporter.problem("end_run", f"run {run_id} was left RUNNING: no time was left of "
                         f"flush_timeout_s={flush_timeout_s:g} s to end it")  # fmt: skip
        return False
    errors: list[BaseException] = []

    def end() -> None:
        try:
            check_reachable(logger.run.tracking_uri, min(seconds, 3.0))
            logger.end_run()
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    ender = threading.Thread(target=end, name="mlflow-neuron-end-run", daemon=True)
    ender.start()
    ender.join(seconds)
    if ender.is_alive() or errors:
        why = errors[0] if errors else TimeoutError(f"no answer within {seconds:.1f} s")
        reporter.problem("end_run", f"run {run_id} was left RUNNING: it could not be ended", why)
        return False
    return True
