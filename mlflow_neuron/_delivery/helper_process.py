"""One running helper process, seen from the training process: its pipes and two threads.

A writer thread feeds its stdin (a full pipe never blocks training), a reader thread hands every
message from its stdout to `on_message`, then {"type": "eof"}. The protocol is `helper`'s.
"""

from __future__ import annotations

import builtins
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

HELPER_COMMAND = (sys.executable, "-m", "mlflow_neuron._delivery.helper")


class HelperError(RuntimeError):
    """An error raised in the helper process (its type name and message)."""


class HelperProcess:
    """One running helper: its pipes, a writer thread (a full pipe never blocks training) and a
    reader thread that hands every message to `on_message`, then {"type": "eof"}."""

    def __init__(self, init: dict, on_message, command: tuple[str, ...] | None = None) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        # subprocess, never a bare fork: the Neuron and CUDA runtimes do not survive a fork.
        # The same session on purpose: Linux's autogroup scheduling weighs sessions against each
        # other, so only inside the training's own session does the helper's lower priority count.
        # (It ignores SIGINT: a Ctrl-C reaches training; the helper finishes its jobs and exits.)
        self.proc = subprocess.Popen(
            list(command or HELPER_COMMAND), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
        )  # fmt: skip
        self._outgoing: queue.Queue[bytes | None] = queue.Queue()
        self._input_ended = False
        self._on_message = on_message
        self.send(init)
        threading.Thread(target=self._write, name="mlflow-neuron-handoff-writer", daemon=True).start()
        threading.Thread(target=self._read, name="mlflow-neuron-handoff-reader", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: dict) -> None:
        if not self._input_ended:  # after the end, nobody would write it
            self._outgoing.put((json.dumps(message) + "\n").encode())

    def end_input(self) -> None:
        if not self._input_ended:
            self._input_ended = True
            self._outgoing.put(None)

    def wait_written(self, timeout: float | None = None) -> bool:
        """Waits until every message so far is in the pipe (or the helper is gone); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outgoing.unfinished_tasks and self.alive:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def _write(self) -> None:
        stdin = self.proc.stdin
        while True:
            data = self._outgoing.get()
            try:
                if data is None:
                    stdin.close()
                    return
                stdin.write(data)
                stdin.flush()
            except (OSError, ValueError):
                return  # the helper is gone: the reader reports it
            finally:
                self._outgoing.task_done()

    def _read(self) -> None:
        for line in lines_of(self.proc.stdout.fileno()):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            self._on_message(self, message)
        self._on_message(self, {"type": "eof"})


def lines_of(fd: int):
    """The lines read from `fd` until EOF, by raw reads. A daemon thread blocked in a buffered
    file's read holds that file's lock, and the interpreter's exit then waits for it (until the
    other end closes: for a helper that delivers after training's exit, seconds) or aborts."""
    rest = b""
    while chunk := os.read(fd, 1 << 16):
        *complete, rest = (rest + chunk).split(b"\n")
        for line in complete:
            yield line + b"\n"
    if rest:
        yield rest


def init_message(sender, preparer, exit_budget_s: float, strict: bool = False) -> dict:
    """The helper's first message: the run, the in-process sender's settings, the preparer's
    settings and the op keys handed out so far (so both processes name ops alike)."""
    return {
        "op": "init",
        "run": asdict(sender.logger.run),
        "sender": {"max_pending": sender.max_pending, "retries": sender.retries,
                   "retry_wait_s": sender.retry_wait_s, "outbox": str(sender.outbox)},
        "preparer": {"top_k": preparer.top_k, "rank": preparer.rank, "primary": preparer.primary,
                     "all_ranks": preparer.all_ranks, "known": preparer.export()},
        "exit_budget_s": exit_budget_s,
        "strict": strict,  # errors the training process raises go along with their problems
    }  # fmt: skip


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
