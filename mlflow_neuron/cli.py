"""`mlflow-neuron` command line.

    mlflow-neuron compare --experiment NAME [--runs ...] [--baseline RUN] [--fail-if-slower PCT] ...
    mlflow-neuron annotate --model NAME --version V --run RUN_ID
    mlflow-neuron ingest PATH [--run-id ID | --experiment NAME --run-name NAME]
    mlflow-neuron sync [--outbox DIR] [--tracking-uri URI] [--retry-rejected [--run-id ID]]
    mlflow-neuron open RUN_ID [--step N] [--dest DIR] [--no-launch]

Exit codes: 0 done; 1 the gate failed (compare) or deliverable records were kept (sync); 2 usage
error (bad arguments, or a run, experiment, model version or folder that does not exist); 3 the
tracking server is down, refuses connections, or does not answer in time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from ._delivery import outbox as _outbox
from ._cli_checks import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    non_negative_float,
    non_negative_int,
    positive_int,
)

# The CLI's own process gives up on a server that answers nothing in seconds, not minutes: MLflow's
# defaults retry a dead server 7 times with exponential backoff (about 4 minutes). The user's
# environment still wins.
CLI_HTTP_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
TRACKING_URI_HELP = ("MLflow tracking server or store, e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db "
                     "(default: MLFLOW_TRACKING_URI, else ./mlflow.db)")  # fmt: skip


def sync(outbox: str, tracking_uri: str | None = None, out=None, *, retry_rejected: bool = False,
         run_id: str | None = None, err=None):  # fmt: skip
    """Replays outbox records into their runs, removing each one delivered; returns a `SyncResult`
    (`exit_code(result)` is the command's exit code).

    Idempotent: a record sent twice (a second sync, or one after a partial replay) leaves every
    metric point and artifact once. A record the server refuses for good (the run does not exist
    or was deleted, permission denied, an invalid value) moves to `<outbox>/rejected/` with a
    `reason` file; those are only sent again with `retry_rejected`, into `run_id` if given. A run
    that the callback would have created and ended is ended (FINISHED) once all its records are in.
    """
    from ._delivery.sync import sync_outbox

    return sync_outbox(outbox, tracking_uri, out, retry_rejected=retry_rejected, run_id=run_id, err=err)


def exit_code(result) -> int:
    """`sync`'s exit code: 2 the outbox was refused, 3 a server did not answer, 1 records were kept."""
    if result.refused:
        return EXIT_USAGE
    if result.unreachable:
        return EXIT_UNREACHABLE
    return EXIT_FAILED if result.kept else EXIT_OK


def compare(args: argparse.Namespace, out=None) -> int:
    import tempfile
    from pathlib import Path

    import mlflow

    from ._compare import render as _render
    from ._compare.profiles import compare_runs, load_timelines
    from ._compare.publish import attach_comparison

    out = out or sys.stdout
    frame = compare_runs(args.runs or [], args.baseline, args.metric, args.step, experiment=args.experiment,
                         tracking_uri=args.tracking_uri, skip_steps=args.skip_steps, noise_pct=args.noise_pct)
    rendered = {
        "table": lambda: _render.text(frame, args.top),
        "markdown": lambda: _render.markdown(frame, args.top),
        "csv": lambda: _render.csv(frame),
        "json": lambda: _render.as_json(frame),
    }[args.format]()
    print(rendered, file=out)
    if args.log_to:
        uri = args.tracking_uri or mlflow.get_tracking_uri()
        with tempfile.TemporaryDirectory() as tmp:
            chart = _render.png(frame, Path(tmp, "comparison.png"))
            page = Path(tmp, "report.html")
            timelines = load_timelines(frame, uri)
            page.write_text(_render.html_page(frame, chart, timelines=timelines), encoding="utf-8")
            attach_comparison(uri, args.log_to, frame, [chart, page])
        print(f"attached comparison/ops.json, comparison.png, report.html and the verdicts to run {args.log_to}",
              file=out)  # fmt: skip
    if args.fail_if_slower is None:
        return 0
    return _gate(frame, args.fail_if_slower, args.min_time_us, out)


def _gate(frame, percent: float, min_us: float, out) -> int:
    """Exit 1 only for a row whose whole 95% interval lies above +percent; print that interval."""
    from ._compare.gate import gate_lines

    failed, lines = gate_lines(frame, percent, min_us)
    for line in lines:
        print(line, file=out)
    return EXIT_FAILED if failed else EXIT_OK


def annotate(args: argparse.Namespace, out=None) -> int:
    from ._compare.publish import annotate_model_version

    out = out or sys.stdout

    tags = annotate_model_version(args.model, args.version, args.run, step=args.step, tracking_uri=args.tracking_uri,
                                  baseline_run_id=args.baseline, skip_steps=args.skip_steps)  # fmt: skip
    for key, value in tags.items():
        print(f"{key} = {value}", file=out)
    return 0


def ingest(args: argparse.Namespace, out=None) -> int:
    import uuid

    import mlflow
    from mlflow.tracking import MlflowClient

    from ._capture.ingest import ingest as ingest_path
    from ._delivery.model import RunRef

    uri = args.tracking_uri or mlflow.get_tracking_uri()

    def new_run() -> RunRef:  # made once the first trace has been read: a bad path creates nothing
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(args.experiment or "Default")
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(args.experiment or "Default")
        return RunRef(uri, None, experiment_id, args.run_name or Path(args.path).name, uuid.uuid4().hex)

    run = RunRef(uri, args.run_id) if args.run_id else new_run
    cap = None if args.max_file_mb is None else int(args.max_file_mb * 1024**2)
    run_id, cycles = ingest_path(Path(args.path), run, top_k=args.top_k, max_file_bytes=cap, out=out,
                                 log_timeline=args.timeline, timeline_max_spans=args.timeline_max_spans)  # fmt: skip
    if not args.run_id:
        MlflowClient(uri).set_terminated(run_id)
    print(f"ingested {cycles} cycle(s) from {args.path} into run {run_id}", file=out or sys.stdout)
    return 0


def open_session(args: argparse.Namespace, out=None) -> int:
    """Downloads a cycle's Neuron session folder and opens it in Neuron Explorer (or prints how)."""
    from ._compare.runs import download_neuron_files
    from ._neuron.explorer import open_in_explorer, opened_profile

    step, neuron_dir = download_neuron_files(args.run, args.step, args.dest, args.tracking_uri)
    return open_in_explorer(opened_profile(args.run, step, neuron_dir), launch=not args.no_launch, out=out)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (exit 2), pointing at --help instead of printing the usage."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _outbox_folder(text: str) -> str:
    """An outbox given explicitly must be an existing folder: a typo is not an empty outbox."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist (the outbox is a folder the callback writes)")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder (the outbox is a folder the callback writes)")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlflow-neuron", description="PyTorch profiler results as MLflow data.",
                     epilog="exit codes: 0 done, 1 regression found (compare) or records kept (sync), "
                     "2 usage error or unknown run/experiment/model version, 3 tracking server unreachable")  # fmt: skip
    parser.add_argument("--version", action="version", version=f"mlflow-neuron {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show MLflow's own INFO messages")
    commands = parser.add_subparsers(dest="command", required=True)
    sync_cmd = commands.add_parser(
        "sync",
        help="send cycles kept in the outbox to their runs",
        description="Send profiler cycles kept in the outbox to their MLflow runs, then remove them.\n"
        "Records the server refused for good (the run does not exist or was deleted, permission denied,\n"
        "an invalid value) wait in <outbox>/rejected/ with a reason file; --retry-rejected sends them again.\n\n"
        "example: mlflow-neuron sync --outbox ./mlflow-neuron-outbox\n"
        "         mlflow-neuron sync --retry-rejected --run-id 0123abcd...   # refused records, into another run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sync_cmd.add_argument("--outbox", type=_outbox_folder,
                          help=f"outbox folder (default: ./{_outbox.DEFAULT_OUTBOX}, if there is one)")  # fmt: skip
    sync_cmd.add_argument("--tracking-uri", help="send to this tracking server or store instead of the one each "
                          "record names, e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db")  # fmt: skip
    sync_cmd.add_argument("--retry-rejected", action="store_true",
                          help="send the records in <outbox>/rejected/ again (nothing else)")  # fmt: skip
    sync_cmd.add_argument("--run-id", help="with --retry-rejected: send them into this run instead")

    cmp = commands.add_parser(
        "compare",
        help="per-op comparison of profiled runs; a CI gate with --fail-if-slower",
        description="Compare profiled runs op by op against a baseline.\n\n"
        "example: mlflow-neuron compare --experiment rmsnorm-variants --baseline naive --fail-if-slower 10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmp.add_argument("--experiment", help="experiment name: its latest variants, and where run names are looked up")
    cmp.add_argument("--runs", nargs="+", help="run ids, run names, parent runs, or models:/NAME/VERSION")
    cmp.add_argument("--baseline", help="run name or id to compare against (default: the first run)")
    cmp.add_argument("--metric", default="self_device_time_us", choices=["self_device_time_us", "self_cpu_time_us"],
                     help="what to compare: device time (default; every run is compared on self CPU time "
                     "instead when one has no device time, and the output says so) or self CPU time")
    cmp.add_argument("--step", type=non_negative_int,
                     help="only the profiler cycle logged at this step (default: the steps of every cycle)")
    cmp.add_argument("--skip-steps", type=non_negative_int, default=0, metavar="K",
                     help="leave out each run's first K profiled steps (default: %(default)s)")
    cmp.add_argument("--noise-pct", type=non_negative_float, default=2.0, metavar="PCT",
                     help="changes smaller than this are 'no change' (default: %(default)s)")
    cmp.add_argument("--top", type=positive_int, default=15, help="ops shown in table/markdown (default: %(default)s)")
    cmp.add_argument("--format", default="table", choices=["table", "markdown", "csv", "json"])
    cmp.add_argument("--fail-if-slower", type=non_negative_float, metavar="PCT",
                     help="exit 1 if the whole 95%% interval of an op or the total is above +PCT%%")
    cmp.add_argument("--min-time-us", type=non_negative_float, default=0.0, metavar="US",
                     help="the gate ignores ops below this median in both runs (the total is always checked)")
    cmp.add_argument("--log-to", metavar="RUN_ID", help="attach the table, a PNG chart and an HTML report to this run")
    cmp.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    ing = commands.add_parser(
        "ingest",
        help="log a Neuron profile folder, a tensorboard trace folder or a chrome trace into a run",
        description="Log profiles taken elsewhere, with the same metrics and layout as the callback.\n\n"
        "example: mlflow-neuron ingest ./neuron_profile --experiment trn2-runs --run-name llama-step",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ing.add_argument("path", help="Neuron profile output folder, tensorboard trace folder, or one trace file")
    target = ing.add_mutually_exclusive_group()
    target.add_argument("--run-id", help="log into this existing run")
    target.add_argument("--experiment", help="create a run in this experiment (created if missing)")
    ing.add_argument("--run-name", help="name of the created run (default: the folder's name)")
    ing.add_argument("--top-k", type=non_negative_int, default=50,
                     help="ops that get per-op metrics (default: %(default)s); ops.json keeps every op")  # fmt: skip
    ing.add_argument("--max-file-mb", type=non_negative_float,
                     help="larger files are listed, not uploaded (default: no cap)")  # fmt: skip
    ing.add_argument("--no-timeline", dest="timeline", action="store_false",
                     help="do not log each cycle as an MLflow trace (its timeline)")  # fmt: skip
    ing.add_argument("--timeline-max-spans", type=positive_int, default=2000,
                     help="spans per cycle trace at most (default: %(default)s)")  # fmt: skip
    ing.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    opn = commands.add_parser(
        "open",
        help="download a cycle's Neuron session folder and open it in Neuron Explorer",
        description="Download a profiled cycle's Neuron files (profiler/step_<N>/neuron/, layout kept) and run\n"
        "`neuron-explorer view -d <session>`; without neuron-explorer installed, print that command.\n\n"
        "example: mlflow-neuron open 0123abcd... --step 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    opn.add_argument("run", help="the profiled run's id")
    opn.add_argument("--step", type=non_negative_int,
                     help="profiler cycle (default: the last with Neuron files)")
    opn.add_argument("--dest", help="download folder (default: ./mlflow-neuron-open/<run id>/step_<N>)")
    opn.add_argument("--no-launch", action="store_true", help="download and print the command, do not run it")
    opn.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    ann = commands.add_parser(
        "annotate",
        help="put a run's profile on a registered model version (perf.* tags, description table)",
        description="Annotate a registered model version with the profile of a run.\n\n"
        "example: mlflow-neuron annotate --model rmsnorm --version 3 --run 0123abcd...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ann.add_argument("--model", required=True)
    ann.add_argument("--version", required=True)
    ann.add_argument("--run", required=True, help="the profiled run's id")
    ann.add_argument("--step", type=non_negative_int, help="profiler cycle (default: the run's last)")
    ann.add_argument("--baseline", metavar="RUN_ID", help="also state the verdict against this run (perf.verdict)")
    ann.add_argument("--skip-steps", type=non_negative_int, default=0, metavar="K",
                     help="leave out the first K profiled steps of each run (default: %(default)s)")
    ann.add_argument("--tracking-uri", help=TRACKING_URI_HELP)

    for command in commands.choices.values():  # -v also after the command name
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show MLflow's own INFO messages")  # fmt: skip
    return parser


def sync_command(args: argparse.Namespace, out=None) -> int:
    if args.run_id and not args.retry_rejected:
        print("mlflow-neuron sync: error: --run-id goes with --retry-rejected (see mlflow-neuron sync --help)",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    outbox = args.outbox or _outbox.DEFAULT_OUTBOX
    if args.outbox is None and not Path(outbox).is_dir():
        print(f"nothing to sync: no outbox at ./{outbox}", file=out or sys.stdout)
        return EXIT_OK
    result = sync(outbox, args.tracking_uri, out, retry_rejected=args.retry_rejected, run_id=args.run_id)
    return exit_code(result)


# Each command: a function (args) -> exit code. Errors they raise are mapped to exit codes in main().
COMMANDS = {"sync": sync_command, "compare": compare, "annotate": annotate, "ingest": ingest, "open": open_session}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = {
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # it would garble our own progress lines
        "MLFLOW_LOGGING_LEVEL": "INFO" if args.verbose else "WARNING",
        **CLI_HTTP_SETTINGS,
    }
    with _environment_defaults(settings, force={"MLFLOW_LOGGING_LEVEL"} if args.verbose else set()):
        _quiet(verbose=args.verbose)
        try:
            _check_server(args)
            return COMMANDS[args.command](args)
        except Exception as error:  # noqa: BLE001 - mapped to an exit code and one line, or re-raised
            code, message = _exit_for(error)
            if code is None:
                raise
    print(f"mlflow-neuron {args.command}: error: {message}", file=sys.stderr)
    return code


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
    from ._delivery.probe import check_reachable

    uri = getattr(args, "tracking_uri", None)
    if uri is None and args.command != "sync":
        uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_reachable(uri)  # before torch and MLflow are imported: a dead server is known in a second
        from ._delivery.mlflow_io import check_tracking_uri

        check_tracking_uri(uri)


def _exit_for(error: BaseException) -> tuple[int | None, str]:
    """(exit code, one line) for errors a user can act on; (None, "") for bugs, which keep their traceback."""
    from ._delivery.failures import is_unreachable, reason

    if isinstance(error, ConnectionError):  # the probe's own, which says which server and why
        return EXIT_UNREACHABLE, str(error)
    from mlflow.exceptions import MlflowException

    from ._compare.runs import RunNotFound

    if is_unreachable(error):
        return EXIT_UNREACHABLE, f"the tracking server did not answer ({reason(error)})"
    if isinstance(error, (RunNotFound, ValueError)):
        return EXIT_USAGE, str(error)
    if isinstance(error, MlflowException) and error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
        return EXIT_USAGE, " ".join(error.message.split())
    return None, ""


def _quiet(verbose: bool) -> None:
    """MLflow's INFO chatter (database migrations, 'Created run ...') is hidden unless -v.

    MLflow reads MLFLOW_LOGGING_LEVEL when it is imported; alembic's migration lines need their
    own logger turned down."""
    if verbose or "mlflow" in sys.modules:
        return  # imported already (an embedding program): its logging is its own business
    logging.getLogger("alembic").setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
