"""What the callback changes on a `torch.profiler.profile` object, all of it here.

Checked on torch 2.13.0, where `profile.__exit__` calls `self.stop()` on the instance and
`on_trace_ready` runs inside `stop()` (the last cycle) or `step()` (every other one):

- `prof.stop` is wrapped once per callback, so pending cycles are flushed when the profile ends;
- `prof.export_chrome_trace` is wrapped while the user's handlers run, to learn which trace files
  they wrote (the callback uploads one of them instead of exporting the cycle again);
- the caller's frames are read to tell a cycle that ends the profile from one that does not;
- the instance's `action_map` (torch's per-instance table of what each schedule transition runs)
  gets a first entry on the transitions out of NONE, so a profiled window's start is marked
  (the host is sampled) where the profiler leaves NONE, before it records anything.

Each wrapper is an attribute on the instance, removed or harmless when torch changes: the class
is never patched.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from torch.profiler import ProfilerAction

_OWNER = "_mlflow_neuron_flush"  # the callback whose flush a profile's stop() runs
_WINDOW_OWNER = "_mlflow_neuron_window"  # the callback whose mark a profile's window starts run
_MARK = "_mlflow_neuron_mark"  # tags the entry put into action_map
_WINDOW_STARTS = tuple((ProfilerAction.NONE, action) for action in
                       (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE))  # fmt: skip


def called_from_stop(prof: Any) -> bool:
    """True when torch calls the handler from `prof.stop()` (the cycle that ends the profile).
    Call it from the handler itself: it looks at the handler's callers."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "stop" and frame.f_locals.get("self") is prof:
            return True
        frame = frame.f_back
    return False


def flush_after_stop(prof: Any, owner: object, flush: Callable[[], None]) -> None:
    """Makes `prof.stop()` run `flush()` after it, once per owner (its `__exit__` calls `stop()`)."""
    if getattr(prof, _OWNER, None) is owner:
        return
    original = prof.stop

    def stop_then_flush(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            flush()

    prof.stop = stop_then_flush
    setattr(prof, _OWNER, owner)


def run_handlers(prof: Any, handlers: Iterable[Callable[[Any], Any]], reporter: Any) -> list[str]:
    """Calls the user's handlers, each guarded; returns the chrome traces they exported, in order."""
    exported: list[str] = []
    original = prof.export_chrome_trace

    def recording_export(path: str, *args: Any, **kwargs: Any) -> Any:
        result = original(path, *args, **kwargs)
        exported.append(os.fspath(path))
        return result

    prof.export_chrome_trace = recording_export
    try:
        for handler in handlers:
            try:
                handler(prof)
            except Exception as error:  # noqa: BLE001
                name = getattr(handler, "__qualname__", repr(handler))
                reporter.problem(f"handler:{name}", f"on_trace_ready handler {name} failed", error)
    finally:
        del prof.export_chrome_trace
    return exported


def mark_window_starts(prof: Any, owner: object, mark: Callable[[], None]) -> None:
    """Makes `prof` call `mark()` whenever it leaves NONE for WARMUP or RECORD, once per owner.

    torch's `step()` and `start()` run the actions that `prof.action_map[(previous, next)]` lists,
    so an entry there costs nothing on the steps in between (a `prof.step` wrapper would cost every
    step), and put first it runs before `start_trace`: with `warmup=0` the sampling is not recorded
    in the first profiled step. The window of a profile's first cycle starts at the owner's previous
    mark: the hook is put in when that cycle is read. Another torch without the table: no hook."""
    if getattr(prof, _WINDOW_OWNER, None) is owner:
        return
    actions = getattr(prof, "action_map", None)
    if not isinstance(actions, dict):
        return

    def window_starts() -> None:
        mark()

    setattr(window_starts, _MARK, True)
    for transition in _WINDOW_STARTS:
        listed = actions.get(transition)
        if isinstance(listed, list):
            listed[:] = [window_starts, *(a for a in listed if not getattr(a, _MARK, False))]
    setattr(prof, _WINDOW_OWNER, owner)
