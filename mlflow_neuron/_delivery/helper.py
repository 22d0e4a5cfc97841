"""The helper process: the outbox's consumer while training runs, so that reading and sending a
cycle never takes the training process's time. It imports no torch.

    python -m mlflow_neuron._delivery.helper <outbox>

It takes the outbox's `.helper.lock` first, for its life: the ranks of a node share one outbox and
one helper, and a second helper started beside the first exits at once. Then it imports MLflow and
drains the outbox (`Drain.follow`), each pass under the consumer lock, until its input ends: the
training process closed it (at close(), which then drains what is left itself), or died. A thread
reads capture requests on the runs of `callback.schedule()` (`listener`).

Nothing but this crosses its pipes. In: one JSON line, the settings (the tracking URIs with their
credentials, which are never written to disk), then EOF to stop. Out: JSON lines for the training
process ("ready", "busy", "problem", "progress"), whose reporter says them; every message redacted.
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
from pathlib import Path

from . import entries
from .outbox import private_folder
from .report import redact

NICE = 10  # training wins a shared core; the training process drains itself while it waits at a stop
STOP_GRACE_S = 1.0  # after its input ends, the entry in hand gets this long; then the process exits
POLL_S = 0.05  # how often it looks for new entries (a stat of the outbox folder)


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


def _watch_input(stop: threading.Event) -> None:
    """Stops at EOF on stdin (training closed it or died) or when the parent is gone (a forked child
    of training may still hold the pipe); then the process exits after a short grace."""
    parent = os.getppid()

    def read() -> None:
        while os.read(0, 4096):
            pass
        stop.set()

    def orphan() -> None:
        while os.getppid() == parent and not stop.wait(0.5):
            pass
        stop.set()

    def grace() -> None:
        stop.wait()
        time.sleep(STOP_GRACE_S)
        os._exit(0)  # an entry still in hand stays whole in the outbox; its lock goes with us

    for target in (read, orphan, grace):
        threading.Thread(target=target, name=f"mlflow-neuron-helper-{target.__name__}", daemon=True).start()


def _open_stores(outbox: Path, credentials: dict[str, str]) -> None:
    """Opens each store the training process named, one process at a time (the store lock: a fresh
    sqlite file gets its schema here), before the first pass: MLflow keeps one store per URI, so
    the first cycle costs only its own work (opening a sqlite store in the first pass added about
    half a second to a cycle's time to data, `benchmarks/loop_cost.py --lead 3`)."""
    from mlflow.tracking import MlflowClient

    for uri in credentials.values():
        with entries.store_lock(outbox):
            try:
                MlflowClient(uri)._tracking_client.store
            except Exception:  # noqa: BLE001 - the first delivery meets it again, and reports it
                pass


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for training; its close() stops us
    argv = sys.argv if argv is None else argv
    outbox = Path(argv[1])
    channel = Channel(os.fdopen(os.dup(1), "w", encoding="utf-8"))
    os.dup2(2, 1)  # stray prints (MLflow's) go where stderr goes, never into the protocol
    sys.stdout = sys.stderr
    held = None
    try:  # a producer probing the lock holds it for microseconds: wait a moment for it
        held = entries.lock_file(private_folder(outbox) / entries.HELPER_LOCK, blocking=True, timeout=1.0)
    except OSError as error:
        channel.send(type="problem", kind="helper", message=redact(f"the helper cannot use the outbox {outbox}: {error}"))
        return 2
    if held is None:
        channel.send(type="busy", pid=entries.holder_pid(outbox / entries.HELPER_LOCK))
        return 0
    entries.mark_holder(held)
    settings = json.loads(sys.stdin.buffer.readline() or b"{}")
    stop = threading.Event()
    _watch_input(stop)
    try:
        os.nice(NICE)
    except (AttributeError, OSError):
        pass
    from .._trace.json_text import PARSER
    from .http_budget import bound_this_process
    from . import mlflow_io  # noqa: F401 - MLflow, imported before the first pass takes the consumer lock
    from . import listener
    from .drain import Drain

    bound_this_process()  # MLflow's own retries must not spend a budget inside one call: the drain retries
    _open_stores(outbox.absolute(), settings.get("credentials") or {})
    gc.freeze()  # what the imports made lives as long as we do: out of the cycle collector's sight
    drain = Drain(outbox, ChannelReporter(channel), credentials=settings.get("credentials"),
                  retries=settings.get("retries", 2), retry_wait_s=settings.get("retry_wait_s", 0.5),
                  progress=lambda line: channel.send(type="progress", line=redact(line)))  # fmt: skip
    listener.start(outbox, settings.get("credentials"), ChannelReporter(channel), stop)  # capture requests
    channel.send(type="ready", pid=os.getpid(), parser=PARSER)
    drain.follow(stop, POLL_S)
    # Nothing in hand and nothing to tidy (every write was synchronous, every lock goes with the
    # process): the interpreter's teardown of MLflow and pandas (about half a second) is time the
    # training process's close() would wait for.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
