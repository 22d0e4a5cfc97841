"""What the callback changes on a `torch.profiler.profile` object, all of it here.

Checked on torch 2.13.0, where `profile.__exit__` calls `self.stop()` on the instance and
`on_trace_ready` runs inside `stop()` (the last cycle) or `step()` (every other one):

- `prof.stop` is wrapped once per callback, so pending cycles are flushed when the profile ends;
- `prof.export_chrome_trace` is wrapped while the user's handlers run, to learn which trace files
  they wrote (the callback uploads one of them instead of exporting the cycle again);
- the caller's frames are read to tell a cycle that ends the profile from one that does not.

Each wrapper is an attribute on the instance, removed or harmless when torch changes: the class
is never patched.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

_OWNER = "_mlflow_neuron_flush"  # the callback whose flush a profile's stop() runs


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
