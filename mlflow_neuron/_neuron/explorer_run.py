"""`neuron-explorer view -d <session> --output-format parquet --output-file <our folder>`, run and checked.

The documentation says where the tables land (the `--output-file` folder) but not whether `view`
with `--output-file` exits without serving its UI, nor how the several device profiles of one
session are laid out there. Both are read off what the tool does, never assumed:

- a tool that does not exit within `MLFLOW_NEURON_EXPLORER_TIMEOUT_S` (default 600 s) is stopped,
  with its whole process group, and the message says so (a `view` serving its UI on ports 3001 and
  3002 never exits);
- one that exits with an error, or leaves a process running after it exits (stopped too), is named;
- one that exits 0 without a Summary or Metadata table in our folder is told apart by where it
  wrote instead: the capture folder, or nowhere we can see (its data path, or its UI);
- the layout of what it wrote is read by `processed.read_processed`.

It runs on the thread that prepares the cycle, never the training thread, and says on stderr that
it runs and how long it took: a multi-GB NTFF takes minutes.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from .processed import Processed, read_processed
from .summary import SummaryError

TIMEOUT_ENV = "MLFLOW_NEURON_EXPLORER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
_STOP_GRACE_S = 3.0


def explorer_timeout_s() -> float:
    """The time Explorer gets per session: MLFLOW_NEURON_EXPLORER_TIMEOUT_S, else 600 s."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SummaryError(f"{TIMEOUT_ENV} must be a number of seconds > 0; got {text!r}")
    return value


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def announce(tool: str, say=say_on_stderr) -> bool:
    """Tells the user, once, that Explorer will process the sessions: the process that runs it may
    have no terminal (the helper process). Returns True (said)."""
    try:
        limit = f"up to {explorer_timeout_s():g} s a session"
    except SummaryError as error:
        limit = str(error)
    say(f"mlflow-neuron: {Path(tool).name} processes each cycle's Neuron capture sessions off the training "
        f"thread ({limit}; {TIMEOUT_ENV}); its summary lands in the run when done")
    return True


def parquet_command(tool: str, session: Path, out_dir: Path) -> list[str]:
    return [tool, "view", "-d", str(session), "--output-format", "parquet", "--output-file", str(out_dir)]


def run_to_parquet(tool: str, session: Path, out_dir: Path, timeout_s: float, say=say_on_stderr) -> Processed:
    """Explorer's Parquet output of `session`, written into `out_dir` (ours) and read back.
    Raises SummaryError with what the tool did instead."""
    command = parquet_command(tool, session, out_dir)
    line = shlex.join(command)
    before = _parquet_files(session)
    say(f"mlflow-neuron: {Path(tool).name} is processing {session} (stopped after {timeout_s:g} s)")
    started = time.monotonic()
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    except OSError as error:
        raise SummaryError(f"{line} could not start: {error}") from error
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        _stop_group(process)
        raise SummaryError(f"{line} did not exit within {timeout_s:g} s ({TIMEOUT_ENV}) and was stopped; a `view` "
                           "that serves its UI (ports 3001 and 3002) instead of writing --output-file never "
                           "exits") from error  # fmt: skip
    lingering = _stop_group(process)
    say(f"mlflow-neuron: {Path(tool).name} finished {session.name} in {time.monotonic() - started:.1f} s")
    if process.returncode != 0:
        raise SummaryError(f"{line} exited {process.returncode}: {(err or out or '').strip()[-500:]}")
    processed = read_processed(out_dir)
    if processed.empty:
        raise SummaryError(_wrote_elsewhere(line, session, out_dir, before))
    if lingering:
        raise SummaryError(f"{line} exited but left a process running (a UI server?); it was stopped and its "
                           "tables were not used")  # fmt: skip
    return processed


def _wrote_elsewhere(line: str, session: Path, out_dir: Path, before: set[Path]) -> str:
    new_in_session = sorted(p.relative_to(session).as_posix() for p in _parquet_files(session) - before)
    if new_in_session:
        return (f"{line} exited 0 but wrote its tables into the capture folder ({', '.join(new_in_session[:3])}), "
                "not into the --output-file folder")  # fmt: skip
    written = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    if written:
        return f"{line} exited 0 but wrote no Summary or Metadata table into --output-file (only {', '.join(written[:3])})"
    return (f"{line} exited 0 and wrote nothing into --output-file: this tool may write under its data path "
            "or serve its UI instead")  # fmt: skip


def _parquet_files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*.parquet") if p.is_file()} if folder.is_dir() else set()


def _stop_group(process: subprocess.Popen) -> bool:
    """Stops what is left of the process group started for the tool (only ours: it has its own
    session). True when something was still running."""
    if os.name == "nt":  # no process groups: the tool itself
        if process.poll() is None:
            process.kill()
        process.wait()
        return False
    try:
        os.killpg(process.pid, 0)
    except (ProcessLookupError, PermissionError):
        process.wait()
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
    process.wait()
    return True
