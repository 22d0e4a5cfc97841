"""`mlflow-neuron` command line.

    mlflow-neuron compare --experiment NAME [--runs ...] [--baseline RUN] [--fail-if-slower PCT] ...
    mlflow-neuron annotate --model NAME --version V --run RUN_ID
    mlflow-neuron ingest PATH [--run-id ID | --experiment NAME --run-name NAME]
    mlflow-neuron sync [--outbox DIR] [--tracking-uri URI] [--retry-rejected [--run-id ID] | --retry-damaged]
    mlflow-neuron open RUN_ID [--step N] [--dest DIR] [--no-launch]
    mlflow-neuron history --experiment NAME [--run-name NAME] [--metric M] [--fail-on-change PCT] ...
    mlflow-neuron ranks RUN_ID [--step N] [--format table|markdown|json] [--log-to RUN_ID]
    mlflow-neuron capture RUN_ID [--steps N]

Exit codes: 0 done; 1 the gate failed (compare, history --fail-on-change) or records were kept or
found damaged (sync); 2 usage error (bad arguments, or a run, experiment, model version or folder
that does not exist, a run no job is writing); 3 the tracking server is down, refuses connections, or does not answer in
time, and nothing was changed; 4 inconclusive (compare --fail-if-inconclusive); 5 another sync
holds the outbox (sync); 70 an error of mlflow-neuron itself (a bug: one line, the traceback with
-v), never read as 1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from .._delivery.report import RedactingStream, redact
from .arguments import EXIT_INTERNAL, EXIT_UNREACHABLE, EXIT_USAGE, parser, usage_error
from .commands import COMMANDS, exit_code, sync  # noqa: F401 - `sync` and its exit code, for Python callers

# The CLI's own process gives up on a server that answers nothing in seconds, not minutes: MLflow's
# defaults retry a dead server 7 times with exponential backoff (about 4 minutes). The user's
# environment still wins.
CLI_HTTP_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


def main(argv: Sequence[str] | None = None) -> int:
    root = parser()
    args, extra = root.parse_known_args(argv)
    usage_error(args, root, extra)  # exits 2 on a usage error, before MLflow or torch is imported
    settings = {
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # it would garble our own progress lines
        "MLFLOW_LOGGING_LEVEL": "INFO" if args.verbose else "WARNING",
        **CLI_HTTP_SETTINGS,
    }
    with _environment_defaults(settings, force={"MLFLOW_LOGGING_LEVEL"} if args.verbose else set()), _redacted():
        _quiet(verbose=args.verbose)
        try:
            _check_server(args)
            return COMMANDS[args.command](args)
        except Exception as error:  # noqa: BLE001 - mapped to an exit code and one line
            code, message = _exit_for(error)
            if code is None:  # a bug of ours: never exit 1, which a CI job reads as "regression found"
                code, message = EXIT_INTERNAL, _internal(error, args.verbose)
    print(redact(f"mlflow-neuron {args.command}: error: {message}"), file=sys.stderr)
    return code


@contextlib.contextmanager
def _redacted():
    """Everything the command prints, MLflow's own lines too ("View run at ..."), without the
    user:password@ of any URI in it."""
    with contextlib.redirect_stdout(RedactingStream(sys.stdout)), contextlib.redirect_stderr(RedactingStream(sys.stderr)):
        yield


@contextlib.contextmanager
def _environment_defaults(values: dict[str, str], force: set[str]):
    """Sets environment defaults for this command only (main() may run inside a bigger program)."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if name in force or name not in os.environ:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_server(args: argparse.Namespace) -> None:
    """Fails fast, before any work, when the command's tracking URI is unknown or its server is down.

    A command without --tracking-uri uses MLFLOW_TRACKING_URI (sync: each record's own server,
    probed as it goes)."""
    from .._delivery.failures import check_reachable

    uri = getattr(args, "tracking_uri", None)
    if uri is None and args.command != "sync":
        uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_reachable(uri)  # before torch and MLflow are imported: a dead server is known in a second
        from .._delivery.mlflow_io import check_tracking_uri

        check_tracking_uri(uri)


def _exit_for(error: BaseException) -> tuple[int | None, str]:
    """(exit code, one line) for errors a user can act on; (None, "") for bugs, which keep their traceback."""
    from .._delivery.failures import is_unreachable, reason

    if isinstance(error, ConnectionError):  # the probe's own, which says which server and why
        return EXIT_UNREACHABLE, str(error)
    from mlflow.exceptions import MlflowException

    from .._readback.runs import RunNotFound

    if is_unreachable(error):
        return EXIT_UNREACHABLE, f"the tracking server did not answer ({reason(error)})"
    if isinstance(error, (RunNotFound, ValueError)):
        return EXIT_USAGE, str(error)
    if isinstance(error, MlflowException) and error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
        return EXIT_USAGE, " ".join(error.message.split())
    return None, ""


def _internal(error: Exception, verbose: bool) -> str:
    """The line for an error that is a bug of mlflow-neuron; with -v its traceback is printed first."""
    if verbose:
        traceback.print_exception(error)
    where = " (-v prints the traceback)" if not verbose else ""
    return f"internal error, a bug in mlflow-neuron: {type(error).__name__}: {error}{where}".replace("\n", " ")


def _quiet(verbose: bool) -> None:
    """MLflow's INFO chatter (database migrations, 'Created run ...') is hidden unless -v.

    MLflow reads MLFLOW_LOGGING_LEVEL when it is imported; alembic's migration lines need their
    own logger turned down."""
    if verbose or "mlflow" in sys.modules:
        return  # imported already (an embedding program): its logging is its own business
    logging.getLogger("alembic").setLevel(logging.WARNING)
