"""The helper process: the outbox's consumer while training runs, so that reading and sending a
cycle never takes the training process's time. It imports no torch.

    python -m mlflow_neuron._delivery.helper <outbox>

It takes the outbox's `.consumer.lock` first: the ranks of a node share one outbox and one helper,
and a second helper started beside the first exits at once. Then it imports MLflow and drains the
outbox (`Drain.follow`) until its input ends: the training process closed it, or died.

Nothing but this crosses its pipes. In: one JSON line, the settings (the tracking URIs with their
credentials, which are never written to disk), then a newline for each cycle queued ("there is
work": it looks now), then EOF to stop. Out: JSON lines for the training process ("ready", "busy",
"problem", "progress", and "settled" after a pass that settled entries, so that a close() waiting
on them looks now), whose reporter says them; every message redacted.
Its stderr is not the caller's (the training process starts it with stderr to /dev/null): a
script piped into `tee` sees the pipe end with the script.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

from . import entries
from .outbox import private_folder
from .report import redact

NICE = 10  # training wins a shared core; the training process drains too while it waits at close
STOP_GRACE_S = 1.0  # after its input ends, the entry in hand gets this long; then the process exits
POLL_S = 0.05  # how often it looks for new entries of other processes (a stat of the outbox folder)
STARVED_S = 0.02  # a pass that waited this long for a CPU (busy cores, at nice 10): nudges are not heeded


class Channel:
    """JSON lines to the training process; a closed pipe (training is gone) is ignored."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._lock = threading.Lock()

    def send(self, **message) -> None:
        line = json.dumps(message) + "\n"
        with self._lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                pass


class ChannelReporter:
    """The drain's reporter in the helper: problems go to the training process, redacted."""

    strict = False  # the training process's reporter decides (strict mode raises there)

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        detail = [type(error).__name__, redact(str(error))] if error is not None else None
        self.channel.send(type="problem", kind=kind, message=redact(message), error=detail)


class Pace:
    """Whether the helper heeds a nudge: not after a pass in which its drain waited more than
    `STARVED_S` for a CPU (the kernel's run delay: busy cores, and the helper at nice 10). A starved
    helper that took the cycle just queued would hold it, starved, while the training
    process, about to wait at its stop with a core's priority, waits for it (close() took 1 s
    instead of 0.5 s beside two hogs); it looks at its next poll instead, and the training process
    takes the cycle. Where the kernel does not say (no `/proc/thread-self/schedstat`), always."""

    def __init__(self) -> None:
        self.heed = True
        self._delay_ns = run_delay_ns()

    def after_pass(self) -> None:
        """Called on the drain's thread after each pass."""
        now = run_delay_ns()
        self.heed = now is None or self._delay_ns is None or now - self._delay_ns < STARVED_S * 1e9
        self._delay_ns = now


def run_delay_ns() -> int | None:
    """How long the calling thread has waited on a run queue for a CPU, in all; None if unknown."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stats:
            return int(stats.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _watch_input(stop: threading.Event, wake: threading.Event, pace: Pace) -> None:
    """Wakes the drain at each byte on stdin (the training process queued a cycle) unless it is
    starved (`Pace`); stops at EOF (training closed it or died) or when the parent is gone (a forked
    child of training may still hold the pipe); then the process exits after a short grace."""
    parent = os.getppid()

    def read() -> None:
        while os.read(0, 4096):
            if pace.heed:
                wake.set()
        stop.set()
        wake.set()

    def orphan() -> None:
        while os.getppid() == parent and not stop.wait(0.5):
            pass
        stop.set()
        wake.set()

    def grace() -> None:
        stop.wait()
        time.sleep(STOP_GRACE_S)
        os._exit(0)  # an entry still in hand stays whole in the outbox; its lock goes with us

    for target in (read, orphan, grace):
        threading.Thread(target=target, name=f"mlflow-neuron-helper-{target.__name__}", daemon=True).start()


def _open_stores(credentials: dict[str, str], sending: threading.Event) -> None:
    """Imports MLflow and opens the stores the training process named (about 2 s of a core) while
    the drain prepares the cycles that come meanwhile; it sends once this is done. A store that
    would be created (a fresh sqlite file) is left for the first delivery, under the store lock."""
    try:
        from mlflow.tracking import MlflowClient

        from . import mlflow_io  # noqa: F401 - what the first delivery imports
        from .courier import store_ready

        for uri in credentials.values():
            if store_ready(uri):
                MlflowClient(uri)._tracking_client.store  # MLflow keeps one store per URI
    except Exception:  # noqa: BLE001 - the first delivery meets it again, and reports it
        pass
    finally:
        gc.freeze()
        sending.set()


def _after_pass(channel: Channel, pace: Pace, settled: tuple[str, ...], done) -> None:
    """A pass that settled entries says so: a close() waiting on them looks now, not at its next poll."""
    pace.after_pass()
    if any(o.state in settled for o in done.outcomes):
        channel.send(type="settled")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for training; its close() stops us
    argv = sys.argv if argv is None else argv
    outbox = Path(argv[1])
    channel = Channel(os.fdopen(os.dup(1), "w", encoding="utf-8"))
    os.dup2(2, 1)  # stray prints (MLflow's) go where stderr goes, never into the protocol
    sys.stdout = sys.stderr
    held = None
    try:  # a producer probing the lock holds it for microseconds: wait a moment for it
        held = entries.lock_file(private_folder(outbox) / entries.CONSUMER_LOCK, blocking=True, timeout=1.0)
    except OSError as error:
        channel.send(type="problem", kind="helper", message=redact(f"the helper cannot use the outbox {outbox}: {error}"))
        return 2
    if held is None:
        channel.send(type="busy", pid=entries.holder_pid(outbox / entries.CONSUMER_LOCK))
        return 0
    entries.mark_holder(held)
    settings = json.loads(sys.stdin.buffer.readline() or b"{}")
    stop, wake, pace = threading.Event(), threading.Event(), Pace()
    _watch_input(stop, wake, pace)
    try:
        os.nice(NICE)
    except (AttributeError, OSError):
        pass
    from .._trace.json_text import PARSER
    from .http_budget import bound_this_process

    bound_this_process()  # MLflow's own retries must not spend a budget inside one call: the drain retries
    from .drain import SETTLED, Drain

    gc.freeze()  # what the imports made lives as long as we do: out of the cycle collector's sight
    sending = threading.Event()
    threading.Thread(target=_open_stores, args=(settings.get("credentials") or {}, sending), daemon=True,
                     name="mlflow-neuron-helper-mlflow").start()  # fmt: skip
    drain = Drain(outbox, ChannelReporter(channel), credentials=settings.get("credentials"),
                  retries=settings.get("retries", 2), retry_wait_s=settings.get("retry_wait_s", 0.5), sending=sending,
                  progress=lambda line: channel.send(type="progress", line=redact(line)))  # fmt: skip
    channel.send(type="ready", pid=os.getpid(), parser=PARSER)
    drain.follow(stop, wake, POLL_S, partial(_after_pass, channel, pace, SETTLED))
    # Nothing in hand and nothing to tidy (every write was synchronous, every lock goes with the
    # process): the interpreter's teardown of MLflow and pandas (about half a second) is time the
    # training process's close() would wait for.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
