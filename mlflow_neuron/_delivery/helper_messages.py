"""The training side's handling of the helper's messages (its reader thread calls `_on_message`).

A mixin of `handoff.Handoff`, whose state it reads and changes under `Handoff._lock`.
"""

from __future__ import annotations

import time
from dataclasses import replace

from .helper_process import HelperProcess, remote_error
from .report import logger as _log


class HelperMessages:
    """What the helper says: readiness, accepted cycles, its state, replies, problems, its end."""

    def _on_message(self, proc: HelperProcess, message: dict) -> None:
        kind = message.get("type")
        if kind == "problem":
            self._forward_problem(message)
            return
        if kind == "progress":
            _log.info("%s", message.get("line", ""))
            return
        with self._lock:
            if proc is not self._proc:  # a replaced or handed-over helper: only the run it created counts
                run_id = (message.get("state") or {}).get("run_id")
                if run_id and self.inner.logger.run.run_id is None:
                    self.inner.logger.run = replace(self.inner.logger.run, run_id=run_id)
                return
            if kind == "ready":
                self.parser, self.helper_pid = message.get("parser"), message.get("pid")
                self._helper_fallback = message.get("fallback")
                self._ready = True
                if self.ready_after_s is None:
                    self.ready_after_s = time.monotonic() - self._started_at
            elif kind == "accepted":
                self._unaccepted.pop(message.get("seq"), None)
            elif kind in ("state", "reply"):
                self._take_state(message.get("state") or {})
                if kind == "reply":
                    self._replies[message["seq"]] = message
                    self._final_state = self._final_state or "known" in message  # close's reply
                    if message.get("known"):
                        self.preparer.absorb(message["known"])
            elif kind == "eof":
                if self._closing or proc is self._retiring:
                    self._settle_gone(proc)
                    self._proc = None
                else:
                    self._fail(f"the helper process ended (exit code {proc.proc.wait()})")
            self._cond.notify_all()

    def _take_state(self, state: dict) -> None:
        if not state:
            return
        self._state = state
        rss = state.get("peak_rss_kb")
        if rss:
            self.helper_peak_rss_kb = max(rss, self.helper_peak_rss_kb or 0)
        run_id = state.get("run_id")
        if run_id and self.inner.logger.run.run_id is None:
            self.inner.logger.run = replace(self.inner.logger.run, run_id=run_id)

    def _forward_problem(self, message: dict) -> None:
        error = remote_error(*message["error"]) if message.get("error") else None
        try:
            self.reporter.problem(message.get("kind", "helper"), message.get("message", ""), error)
        except BaseException as raised:  # noqa: BLE001 - strict mode: raised on the training thread
            self._errors.append(raised)
