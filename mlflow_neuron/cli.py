"""`mlflow-neuron` command line.

    mlflow-neuron compare --experiment NAME [--runs ...] [--baseline RUN] [--fail-if-slower PCT] ...
    mlflow-neuron annotate --model NAME --version V --run RUN_ID
    mlflow-neuron ingest PATH [--run-id ID | --experiment NAME --run-name NAME]
    mlflow-neuron sync [--outbox DIR] [--tracking-uri URI]
    mlflow-neuron open RUN_ID [--step N] [--dest DIR] [--no-launch]

Exit codes: 0 done; 1 the gate failed (compare) or some records were kept (sync); 2 usage error
(bad arguments, or a run, experiment or model version that does not exist).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__, _cli_checks, _outbox
from ._cli_checks import (
    EXIT_FAILED,
    EXIT_OK,
    non_negative_float,
    non_negative_int,
    positive_int,
)


def sync(outbox: str, tracking_uri: str | None = None, out=None) -> tuple[int, int]:
    """Replays outbox records into their runs, removing each one delivered.

    Idempotent: a record sent twice (a second sync, or one after a partial replay) leaves every
    metric point and artifact once. Returns (delivered, kept).
    """
    from dataclasses import replace

    from ._mlflow_io import RunLogger

    out = out or sys.stdout

    records = _outbox.pending(outbox)
    loggers: dict[tuple, RunLogger] = {}
    delivered = kept = 0
    for index, record_dir in enumerate(records, 1):
        prefix = f"[{index}/{len(records)}] {record_dir.name}"
        try:
            delivery, run = _outbox.load(record_dir)
            if tracking_uri:
                run = replace(run, tracking_uri=tracking_uri)
            key = (run.tracking_uri, run.run_id, run.run_key)
            logger = loggers.setdefault(key, RunLogger(run))
            _, vanished = logger.deliver(delivery)
        except Exception as error:  # noqa: BLE001 - report, keep the record, go on
            kept += 1
            print(f"{prefix}: kept, {type(error).__name__}: {error}", file=out, flush=True)
            continue
        _outbox.remove(record_dir)
        delivered += 1
        note = f" ({len(vanished)} file(s) had disappeared)" if vanished else ""
        print(
            f"{prefix}: step {delivery.step} -> run {logger.run.run_id} at {logger.run.tracking_uri}: "
            f"{len(delivery.metrics)} metrics, {len(delivery.uploads)} files{note}",
            file=out,
            flush=True,
        )
    print(f"synced {delivered} of {len(records)} record(s) from {outbox}; {kept} kept", file=out, flush=True)
    return delivered, kept


def compare(args: argparse.Namespace, out=None) -> int:
    import tempfile
    from pathlib import Path

    import mlflow
    from mlflow.tracking import MlflowClient

    from . import _render
    from ._compare import compare as compare_profiles
    from ._mlflow_runs import attach_comparison, load_profiles, resolve_runs

    out = out or sys.stdout

    # compare_runs() in three steps, so the statistics options reach compare().
    client = MlflowClient(args.tracking_uri)
    profiles = load_profiles(client, resolve_runs(client, args.runs or [], args.experiment), args.step)
    frame = compare_profiles(profiles, args.baseline, args.metric, skip_steps=args.skip_steps, noise_pct=args.noise_pct)
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
            page.write_text(_render.html_page(frame, chart), encoding="utf-8")
            attach_comparison(uri, args.log_to, frame, [chart, page])
        print(f"attached comparison/ops.json, comparison.png, report.html and the verdicts to run {args.log_to}",
              file=out)  # fmt: skip
    if args.fail_if_slower is None:
        return 0
    return _gate(frame, args.fail_if_slower, args.min_time_us, out)


def _gate(frame, percent: float, min_us: float, out) -> int:
    """Exit 1 only for a row whose whole 95% interval lies above +percent; print that interval."""
    from ._compare import TOTAL, regressions, unchecked

    base, slower = frame.attrs["baseline"], regressions(frame, percent, min_us)
    for r in slower:
        print(f"REGRESSION {r.run}: {r.op} median {r.baseline_us:,.2f} -> {r.run_us:,.2f} us, ratio {r.ratio:.2f} "
              f"(95% CI {r.ratio_low:.2f}\u2013{r.ratio_high:.2f}) > +{percent:g}% vs {base}", file=out)  # fmt: skip
    not_checked: dict[str, list] = {}
    for r in unchecked(frame, min_us):
        not_checked.setdefault(r.run, []).append(r)
    for run, rows in not_checked.items():  # one line per run: single-sample runs have a row per op
        n, total = frame.attrs["n"], next((r for r in rows if r.op == TOTAL), rows[0])
        print(f"NOT CHECKED {run}: {len(rows)} row(s), {n[run]} vs {n[base]} samples, too few for a 95% interval "
              f"({total.op} point ratio {total.ratio:.2f})", file=out)  # fmt: skip
    if not slower:
        print(f"no op or total is proven more than {percent:g}% slower than {base} (95% interval)", file=out)
    return EXIT_FAILED if slower else EXIT_OK


def annotate(args: argparse.Namespace, out=None) -> int:
    from ._registry import annotate_model_version

    out = out or sys.stdout

    tags = annotate_model_version(args.model, args.version, args.run, step=args.step, tracking_uri=args.tracking_uri,
                                  baseline_run_id=args.baseline, skip_steps=args.skip_steps)  # fmt: skip
    for key, value in tags.items():
        print(f"{key} = {value}", file=out)
    return 0


def ingest(args: argparse.Namespace, out=None) -> int:
    import uuid
    from pathlib import Path

    import mlflow
    from mlflow.tracking import MlflowClient

    from ._ingest import ingest as ingest_path
    from ._record import RunRef

    uri = args.tracking_uri or mlflow.get_tracking_uri()
    if args.run_id:
        run = RunRef(uri, args.run_id)
    else:
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(args.experiment or "Default")
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(args.experiment)
        run = RunRef(uri, None, experiment_id, args.run_name or Path(args.path).name, uuid.uuid4().hex)
    run_id, cycles = ingest_path(Path(args.path), run, top_k=args.top_k,
                                 max_file_bytes=int(args.max_file_mb * 1024**2), out=out)  # fmt: skip
    if not args.run_id:
        MlflowClient(uri).set_terminated(run_id)
    print(f"ingested {cycles} cycle(s) from {args.path} into run {run_id}", file=out or sys.stdout)
    return 0


def open_session(args: argparse.Namespace, out=None) -> int:
    """Downloads a cycle's Neuron session folder and opens it in Neuron Explorer (or prints how)."""
    from ._open import download, open_in_explorer

    opened = download(args.run, args.step, args.dest, args.tracking_uri)
    return open_in_explorer(opened, launch=not args.no_launch, out=out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlflow-neuron", description="PyTorch profiler results as MLflow data.")
    parser.add_argument("--version", action="version", version=f"mlflow-neuron {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    sync_cmd = commands.add_parser(
        "sync",
        help="send cycles kept in the outbox to their runs",
        description="Send profiler cycles kept in the outbox to their MLflow runs, then remove them.\n\n"
        "example: mlflow-neuron sync --outbox ./mlflow-neuron-outbox",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sync_cmd.add_argument("--outbox", default=_outbox.DEFAULT_OUTBOX, help="outbox folder (default: %(default)s)")
    sync_cmd.add_argument("--tracking-uri", help="send to this server instead of the one each record names")

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
    cmp.add_argument("--metric", default="self_device_time_us", choices=["self_device_time_us", "self_cpu_time_us"])
    cmp.add_argument("--step", type=non_negative_int, help="profiler cycle to compare (default: each run's last)")
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
    cmp.add_argument("--tracking-uri")

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
    ing.add_argument("--top-k", type=int, default=50)
    ing.add_argument("--max-file-mb", type=float, default=512, help="larger files are listed, not uploaded")
    ing.add_argument("--tracking-uri")

    opn = commands.add_parser(
        "open",
        help="download a cycle's Neuron session folder and open it in Neuron Explorer",
        description="Download a profiled cycle's Neuron files (profiler/step_<N>/neuron/, layout kept) and run\n"
        "`neuron-explorer view -d <session>`; without neuron-explorer installed, print that command.\n\n"
        "example: mlflow-neuron open 0123abcd... --step 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    opn.add_argument("run", help="the profiled run's id")
    opn.add_argument("--step", type=_cli_checks.non_negative_int,
                     help="profiler cycle (default: the last with Neuron files)")
    opn.add_argument("--dest", help="download folder (default: ./mlflow-neuron-open/<run id>/step_<N>)")
    opn.add_argument("--no-launch", action="store_true", help="download and print the command, do not run it")
    opn.add_argument("--tracking-uri")

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
    ann.add_argument("--tracking-uri")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # our own output stays readable
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "sync":
        _, kept = sync(args.outbox, args.tracking_uri)
        return 1 if kept else 0
    from mlflow.exceptions import MlflowException

    from ._mlflow_runs import RunNotFound

    try:
        return {"compare": compare, "annotate": annotate, "ingest": ingest, "open": open_session}[args.command](args)
    except (RunNotFound, ValueError) as error:
        message = str(error)
    except MlflowException as error:
        if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        message = error.message
    print(f"mlflow-neuron {args.command}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
