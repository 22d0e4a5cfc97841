"""The helper process: reads, aggregates and delivers profiler cycles outside the training process.

    python -m mlflow_neuron._delivery.helper   # started by `helper_process.HelperProcess`, one per callback

The training process saves each cycle's chrome trace (Kineto's C++ writer) and sends a job: a
`CycleJob` as plain data, naming the trace, the step, the files to upload and the manifest. Here
the job goes through the same `Preparer` and `Sender` as in the training process (the trace read
with orjson by `_trace.summarize`, equal to `extract_cycle(prof.events())` on every op row), with
retries and the outbox, so the training process keeps its GIL for training. It never imports
torch: its imports are MLflow's, pandas' and numpy's.

Protocol: JSON lines. Requests on stdin: `init` (first), `cycle`, `flush`, `spill`, `close`, `detach`
(deliver everything, however long it takes, and exit at EOF; see `handed_over`), `end_run`. Answers on
the original stdout (fd 1 is pointed at stderr so that nothing else can write there):
`ready`, `accepted` (a cycle was taken), `reply` (to flush and close, with the state),
`state` (deliveries, outbox records, the run id), `problem` (for the training process's reporter),
`progress` (a large upload's progress line, for the training process's log).

Its pipe is read from its first moment, before its imports: training never waits on a full pipe.
Until it detaches, the helper never outlives its parent by more than its budget: stdin EOF (the parent closed it or
died) or a parent that went away closes the sender within `exit_budget_s`, and a watchdog ends
the process if that close itself hangs. An orphan (its parent died) gets longer (ORPHAN_GRACE_S):
nobody else can store the cycles it holds.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Any

EXIT_GRACE_S = 30.0  # on top of the close budget: time to write what is left into the outbox
# An orphan (its training process died) has nobody to hand its cycles back to and nobody waiting
# on it: it takes this long to store them. At nice 19 beside busy cores it got ~1.5% of a CPU,
# and 30 s was not enough to write three small cycles; its watchdog killed it and they were lost.
ORPHAN_GRACE_S = 600.0
STATE_POLL_S = 0.05
DETACHED_BUDGET_S = 600.0  # a detached helper delivers its backlog; what is left then goes to the outbox
QUEUED_JOBS = 10_000  # jobs the helper's sender may queue before the next goes to the outbox
# When training and the helper want one core, training gets ~90% of it. Not 19: beside other busy
# processes (DataLoader workers, a neighbour's job) a helper at 19 got ~1.5% of a core, took minutes
# to start, and cycles waited out the budget and went to the outbox.
NICE = 10


class Channel:
    """JSON lines to the parent; writes from any thread, never raises (a gone parent is EOF later)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, **message: Any) -> None:
        line = json.dumps(message, default=str) + "\n"
        with self._lock:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (OSError, ValueError):
                pass


class ForwardingReporter:
    """The Reporter the sender sees: problems go to the training process, which warns or raises."""

    strict = False  # the training process's setting: with it, problems carry their errors

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.counts: dict[str, int] = {}

    detached = False  # let go at the exit: once the training process is gone, problems go to stderr
    parent: int | None = None

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        detail = None if error is None else [type(error).__name__, str(error)]
        self.channel.send(type="problem", kind=kind, message=message, error=detail)
        if self.detached and self.counts[kind] == 1 and os.getppid() != self.parent:
            print(f"mlflow-neuron helper: {message}" + (f" ({detail[0]}: {detail[1]})" if detail else ""),
                  file=sys.stderr, flush=True)  # fmt: skip


class Helper:
    def __init__(self, init: dict, channel: Channel) -> None:
        from .http_budget import bound_this_process
        from .job import CycleJob
        from .mlflow_io import RunLogger
        from .model import RunRef
        from .prepare import Preparer
        from .sender import Sender

        bound_this_process()  # MLflow's retries must not spend the exit budget inside one call
        self.job_of = CycleJob.from_message
        self.channel = channel
        self.reporter = ForwardingReporter(channel)
        self.reporter.strict = bool(init.get("strict"))  # it never raises: the training process does
        self.exit_budget_s = float(init.get("exit_budget_s", 10.0))
        self.parent = self.reporter.parent = os.getppid()  # the training process; another parent: it ended
        settings = dict(init["preparer"])
        known = settings.pop("known", {})
        self.preparer = Preparer(self.reporter, **settings)
        self.preparer.absorb(known)  # the run's op keys and device-time flag so far
        # No write-ahead here: a cycle the helper holds is still staged on the training side, which
        # takes it back if the helper dies, and the helper outlives a training process that dies.
        # A record written ahead would race that hand-back (a kill between the record's rename and
        # the staged folder's removal stores the cycle twice).
        # Its queue holds jobs, not cycles (a job names a trace on disk: a few hundred bytes), so
        # `max_pending`, which bounds the memory of cycles read in the training process, does not
        # apply: a backlog is sent in batches, not spilled to the outbox and replayed one by one.
        sending = {**init["sender"], "max_pending": max(init["sender"].get("max_pending", 8), QUEUED_JOBS)}
        # A large file's progress lines go to the training process's log, where the user looks.
        logger = RunLogger(RunRef(**init["run"]), progress=lambda line: channel.send(type="progress", line=line))
        self.sender = Sender(logger, self.reporter, self.preparer.prepare, background=True, write_ahead=False,
                             **sending)  # fmt: skip
        self.sender.pace.after_exit = bool(init.get("hands_over"))  # what its "falling behind" warning says
        # What the imports made lives as long as the helper: out of the cycle collector's sight,
        # each cycle's thousands of parsed events no longer make it walk all of MLflow again.
        gc.freeze()
        self.sender.warm()  # the store opens while training runs, not when the first cycle waits
        self._last_state: dict | None = None
        self.end_run = False  # asked to end the run (FINISHED) after its last cycle
        self._closed = threading.Event()
        self._closing = threading.Lock()
        self._state_thread = threading.Thread(target=self._report_state, name="mlflow-neuron-helper-state",
                                              daemon=True)  # fmt: skip
        self._state_thread.start()

    def state(self) -> dict:
        return {
            "delivered": self.sender.delivered,
            "stored": [str(p) for p in list(self.sender.stored)],
            "rejected": [str(p) for p in list(self.sender.rejected)],
            "pending": self.sender.pending,
            "busy_s": round(self.sender.pace.busy_s, 4),
            "run_id": self.sender.logger.run.run_id,
            "peak_rss_kb": _peak_rss_kb(),
        }

    def handle(self, request: dict) -> bool:
        """Serves one request; False once the helper should exit."""
        op = request.get("op")
        if op == "cycle":
            self.channel.send(type="accepted", seq=request["seq"])
            self.sender.submit(self.job_of(request["job"]))
        elif op == "spill":  # the training process's shutdown budget ran out: queued cycles go to the outbox
            self._guarded(lambda: self.sender.spill(request.get("why", "")))
        elif op == "flush":
            ok = self._guarded(lambda: self.sender.flush(request.get("timeout")))
            self.channel.send(type="reply", seq=request["seq"], ok=bool(ok), state=self.state())
        elif op == "detach":  # the profiler's exit does not wait: deliver everything, then exit at EOF
            self.reporter.detached = True
            self.exit_budget_s = max(self.exit_budget_s, DETACHED_BUDGET_S)
        elif op == "end_run":
            self.end_run = True
        elif op == "close":
            self.close(request.get("timeout"))
            self.channel.send(type="reply", seq=request["seq"], ok=True, state=self.state(),
                              known=self.preparer.export())  # fmt: skip
            return False
        return True

    def close(self, timeout: float | None) -> None:
        # stdin's EOF and the parent watch both close when the parent dies: the second waits for
        # the first, or the process could exit while the first is still storing cycles.
        with self._closing:
            if self._closed.is_set():
                return
            budget = self.exit_budget_s if timeout is None else float(timeout)
            _exit_after(budget + EXIT_GRACE_S, "close", parent=self.parent)
            self._guarded(lambda: self.sender.close(budget))
            if self.end_run:
                self._guarded(self.sender.logger.end_run)
            self._closed.set()
        self._state_thread.join(1.0)  # no state older than the reply may follow it

    def _guarded(self, action):
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - the sender's own errors, already reported
            self.reporter.problem("helper", f"the helper's sender failed: {error}", error)
            return False

    def _report_state(self) -> None:
        while not self._closed.wait(STATE_POLL_S):
            state = self.state()
            if state != self._last_state:
                self._last_state = state
                self.channel.send(type="state", state=state)


def _peak_rss_kb() -> int | None:
    """This process's peak RSS (KiB). Linux's VmHWM: `getrusage`'s maxrss would also count the
    training process's RSS at the moment it forked this one."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    except (ImportError, OSError):
        return None


def _exit_after(seconds: float, why: str, parent: int | None = None) -> None:
    def watchdog() -> None:
        time.sleep(seconds)
        if parent is not None and os.getppid() != parent:
            time.sleep(ORPHAN_GRACE_S - EXIT_GRACE_S)  # an orphan: nobody takes its cycles back
        print(f"mlflow-neuron helper: {why} did not finish in {seconds:.0f} s; exiting", file=sys.stderr, flush=True)
        os._exit(3)

    threading.Thread(target=watchdog, name="mlflow-neuron-helper-watchdog", daemon=True).start()


def _watch_parent(parent: int, lines: queue.SimpleQueue) -> None:
    """Closes the helper when its parent is gone and stdin did not say so (a forked child of the
    training process, such as a DataLoader worker, still holds the pipe): a close request goes in
    after the requests already read, so the cycles they hand over are delivered or stored first."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        lines.put(json.dumps({"op": "close", "seq": 0, "timeout": None}).encode() + b"\n")

    threading.Thread(target=watch, name="mlflow-neuron-helper-parent", daemon=True).start()


def _read_ahead(fd: int) -> queue.SimpleQueue:
    """Reads the pipe from now on, whatever the main thread is doing (importing MLflow: seconds), so
    that the training process never finds it full; b"" at EOF."""
    from .helper_process import lines_of

    lines: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        for line in lines_of(fd):
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=read, name="mlflow-neuron-helper-stdin", daemon=True).start()
    return lines


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for training; stdin EOF ends the helper
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # stray prints (MLflow's, torch's) go to stderr, never into the protocol
    sys.stdout = sys.stderr
    try:
        os.nice(NICE)  # training wins a shared core
    except (AttributeError, OSError):
        pass
    channel = Channel(protocol)
    lines = _read_ahead(sys.stdin.fileno())
    parent = os.getppid()
    helper: Helper | None = None
    while True:
        line = lines.get()
        if not line:  # EOF: the parent closed the pipe, or died
            if helper is not None:
                helper.close(None)
            return 0
        request = None
        try:
            request = json.loads(line)
            if request.get("op") == "init":
                from .._trace.json_text import PARSER
                from .outbox import fallback_folder

                helper = Helper(request, channel)
                _watch_parent(parent, lines)
                channel.send(type="ready", pid=os.getpid(), parser=PARSER, fallback=str(fallback_folder()))
                continue
            if helper is None:
                raise RuntimeError(f"{request.get('op')!r} before init")
            if not helper.handle(request):
                return 0
        except Exception as error:  # noqa: BLE001 - one bad request must not end the helper
            channel.send(type="problem", kind="helper", message=f"the helper could not serve a request: {error}",
                         error=[type(error).__name__, traceback.format_exc(limit=3)])  # fmt: skip
            if isinstance(request, dict) and request.get("op") in ("flush", "close") and "seq" in request:
                channel.send(type="reply", seq=request["seq"], ok=False, state=helper.state() if helper else {})


if __name__ == "__main__":
    sys.exit(main())
