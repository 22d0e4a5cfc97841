"""Trouble inside a training loop is reported once per kind, never raised, except in strict mode."""

from __future__ import annotations

import logging
import re
import warnings

from ..exceptions import MLflowNeuronWarning, strict_from_env

WAIT_IN_OUTBOX = "; the cycles wait in the outbox"  # after the reason, in the "not reachable" warning

logger = logging.getLogger("mlflow_neuron")


# user:password@ (or a token@) after any scheme: a tracking URI, a database URI, a presigned URL.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")


def redact(text: str) -> str:
    """`text` with the user info of every URI in it replaced by `***` (`http://***@host`)."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


class RedactingStream:
    """A text stream that writes everything redacted: what a command prints names no secret."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(redact(text))

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):  # encoding, isatty, fileno: the stream's own
        return getattr(self.stream, name)


class Reporter:
    """Warns once per kind of trouble; in strict mode re-raises instead, so tests see it."""

    def __init__(self, strict: bool | None = None) -> None:
        self.strict = strict_from_env() if strict is None else strict
        self._reported: set[str] = set()
        self.counts: dict[str, int] = {}

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        """Record a problem; call from an `except` block to re-raise it in strict mode."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.strict and error is not None:
            raise error
        message = redact(message)
        if kind in self._reported:
            logger.debug("%s (again): %s", kind, message)
            return
        self._reported.add(kind)
        detail = f": {type(error).__name__}: {one_line(error)}" if error is not None else ""
        warnings.warn(redact(f"mlflow-neuron: {message}{detail}"), MLflowNeuronWarning, stacklevel=3)


def one_line(error: BaseException, limit: int = 300) -> str:
    """An error as one short line: a `shutil.Error` lists every file it failed on; the first will do."""
    import shutil

    if isinstance(error, shutil.Error) and error.args and isinstance(error.args[0], list) and error.args[0]:
        first = error.args[0][0]
        why = first[-1] if isinstance(first, (tuple, list)) else first
        text = f"{why} (and {len(error.args[0]) - 1} more file(s))" if len(error.args[0]) > 1 else str(why)
    else:
        text = str(error)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def report_delivery(reporter: Reporter, run_id: str | None, step: int, problems: list[tuple[str, str]],
                    clashes: dict, vanished: list[str]) -> None:  # fmt: skip
    """What a delivered cycle brought along: its reader's problems, params the run already had
    with other values (kept, as MLflow params are immutable), files gone before upload."""
    for kind, problem in problems:
        reporter.problem(kind, problem)
    if clashes:
        listed = ", ".join(f"{k}: kept {old!r}, not {new!r}" for k, (old, new) in clashes.items())
        reporter.problem("params_clash", f"run {run_id} already has other profiler params ({listed})")
    if vanished:
        reporter.problem(
            "file_vanished",
            f"{len(vanished)} profile file(s) of step {step} disappeared before upload "
            f"(first: {vanished[0]}); the rest of the cycle was logged",
        )


def rejected_message(what: str, run, why: str, path) -> str:
    """What a permanent refusal says: by whom, why, where the record is kept, how to send it later."""
    return (
        f"{what} was refused by {run.tracking_uri} for run {run.run_id} ({why}); retrying cannot help, so it is "
        f"not retried: it is kept in {path.parent}. Once the cause is fixed, `mlflow-neuron sync --outbox "
        f"{path.parent.parent} --retry-rejected [--run-id ID]` sends it"
    )
