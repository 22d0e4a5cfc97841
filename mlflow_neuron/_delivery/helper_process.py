"""Starting the helper process and hearing from it, on the training side.

`HelperLauncher.ensure()` starts a helper when no helper follows the outbox (the ranks of a node
share one), at most once every `RESPAWN_S`, and not again after `MAX_FAILURES` helpers of this
process died unasked: the training process then drains by itself. Its stderr goes to /dev/null,
its stdout is a pipe that only this process reads: what it says reaches the user through this
process's reporter. `stop()` closes its input and waits a moment for it to exit (then kills it):
no process of ours outlives the script, and close() drains what is left without it.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import entries
from .report import logger as _log

HELPER_COMMAND = (sys.executable, "-m", "mlflow_neuron._delivery.helper")
RESPAWN_S = 2.0
MAX_FAILURES = 2
STOP_WAIT_S = 2.0


class HelperError(RuntimeError):
    """An error raised in the helper process (its type name and message)."""


class HelperLauncher:
    def __init__(self, outbox: Path, settings: dict, reporter, command: tuple[str, ...] | None = None) -> None:
        self.outbox = outbox
        self.settings = settings  # the first line it reads: credentials, retries
        self.reporter = reporter
        self.command = tuple(command or HELPER_COMMAND)
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        self.parser: str | None = None
        self.helper_pid: int | None = None
        self.ready_after_s: float | None = None
        self.failures = 0
        self._started_at = -RESPAWN_S
        self._stopping = False
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    @property
    def usable(self) -> bool:
        return self.failures < MAX_FAILURES

    def ensure(self) -> None:
        """Starts a helper unless one runs (ours, or another process's helper of this outbox)."""
        with self._lock:
            if self._stopping or not self.usable or (self.proc is not None and self.proc.poll() is None):
                return
            if time.monotonic() - self._started_at < RESPAWN_S or entries.helper_running(self.outbox):
                return
            self._started_at = time.monotonic()
            try:
                self._spawn()
            except Exception as error:  # noqa: BLE001 - the training process drains by itself
                self.failures = MAX_FAILURES
                self.reporter.problem("helper", "could not start the helper process; cycles are delivered from "
                                      "the training process", error)  # fmt: skip

    def wait_ready(self, timeout: float | None) -> bool:
        self.ensure()
        return self.ready.wait(timeout) or entries.helper_running(self.outbox)

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Closes its input (it stops after the entry in hand) and waits for it; kills it after `wait_s`."""
        self.release()
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def release(self) -> None:
        """Closes its input without waiting: it stops after the entry in hand (its callback is gone)."""
        with self._lock:
            self._stopping = True
            proc = self.proc
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def pids(self) -> tuple[int, ...]:
        proc = self.proc
        return (proc.pid,) if proc is not None and proc.poll() is None else ()

    def take_errors(self) -> list[BaseException]:
        errors, self._errors = self._errors, []
        return errors

    def _spawn(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        # subprocess, never a bare fork: the Neuron and CUDA runtimes do not survive a fork.
        proc = subprocess.Popen([*self.command, str(self.outbox)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, close_fds=True)  # fmt: skip
        self.proc, self.ready = proc, threading.Event()
        try:
            write_input(proc.stdin.fileno(), (json.dumps(self.settings) + "\n").encode())
        except OSError:
            pass  # it exited already (another consumer holds the outbox): the reader sees it
        threading.Thread(target=self._read, args=(proc, time.monotonic()), name="mlflow-neuron-helper-reader",
                         daemon=True).start()  # fmt: skip

    def _read(self, proc: subprocess.Popen, started: float) -> None:
        busy = False
        for line in proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            kind = message.get("type")
            if kind == "ready":
                self.parser, self.helper_pid = message.get("parser"), message.get("pid")
                self.ready_after_s = self.ready_after_s or time.monotonic() - started
                self.ready.set()
            elif kind == "busy":
                busy = True
            elif kind == "progress":
                _log.info("%s", message.get("line", ""))
            elif kind == "problem":
                self._problem(message)
        code = proc.wait()
        if not (busy or self._stopping):
            self.failures += 1
            self.reporter.problem("helper", f"the helper process ended (exit code {code}); "
                                  + ("another one is started" if self.usable else
                                     "cycles are delivered from the training process"))  # fmt: skip

    def _problem(self, message: dict) -> None:
        error = remote_error(*message["error"]) if message.get("error") else None
        try:
            self.reporter.problem(message.get("kind", "helper"), message.get("message", ""), error)
        except BaseException as raised:  # noqa: BLE001 - strict mode: raised on the training thread
            self._errors.append(raised)


def write_input(fd: int, data: bytes) -> None:
    """Writes to the helper's input; OSError (BrokenPipeError) for a helper that has exited, never
    the end of training. Such a write also raises SIGPIPE, whose default action ends the process,
    and a script may have restored it (`signal.signal(SIGPIPE, SIG_DFL)`, as tools piped into
    `head` do): the signal is held for this thread while it writes, and one it raised is taken."""
    held = hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigtimedwait")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE}) if held else None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        if held:
            signal.sigtimedwait({signal.SIGPIPE}, 0)  # the one this write raised, if any
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def remote_error(type_name: str, text: str) -> BaseException:
    """The helper's exception as the same type where it is a builtin or MLflow's own
    (`MlflowException`: strict mode raises a refusal as itself), else a HelperError."""
    import mlflow.exceptions  # the training process has MLflow loaded already

    cls = getattr(builtins, type_name, None) or getattr(mlflow.exceptions, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except Exception:  # noqa: BLE001 - a constructor with other arguments
            pass
    return type(type_name, (HelperError,), {"__module__": __name__})(text)
