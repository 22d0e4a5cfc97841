"""`mlflow-neuron` command line.

    mlflow-neuron compare --experiment NAME [--runs ...] [--baseline RUN] [--fail-if-slower PCT] ...
    mlflow-neuron annotate --model NAME --version V --run RUN_ID
    mlflow-neuron ingest PATH [--run-id ID | --experiment NAME --run-name NAME]
    mlflow-neuron sync [--outbox DIR] [--tracking-uri URI]

Exit codes: 0 done; 1 the gate failed (compare) or some records were kept (sync); 2 usage error
(bad arguments, or a run, experiment or model version that does not exist).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__, _outbox


def sync(outbox: str, tracking_uri: str | None = None, out=None) -> tuple[int, int]:
    """Replays outbox records into their runs, removing each one delivered.

    Idempotent: a record sent twice (a second sync, or one after a partial replay) leaves every
    metric point and artifact once. Returns (delivered, kept).
    """
    from dataclasses import replace

    from ._mlflow_io import RunLogger

    out = out or sys.stdout

    try:
        records = _outbox.pending(outbox)
    except _outbox.OutboxRefused as refused:
        print(f"mlflow-neuron sync: {refused}", file=out, flush=True)
        return 0, 1
    loggers: dict[tuple, RunLogger] = {}
    delivered = kept = 0
    for index, record_dir in enumerate(records, 1):
        prefix = f"[{index}/{len(records)}] {record_dir.name}"
        try:
            delivery, run = _outbox.load(record_dir)
            if tracking_uri:
                run = replace(run, tracking_uri=tracking_uri)
            key = (run.tracking_uri, run.run_id, run.run_key)
            logger = loggers.setdefault(key, RunLogger(run, progress=_progress_printer(out)))
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


def _progress_printer(out):
    """Upload progress of large files, as indented lines under the record being synced."""
    return lambda line: print(f"  {line}", file=out, flush=True)


def compare(args: argparse.Namespace, out=None) -> int:
    import tempfile
    from pathlib import Path

    import mlflow

    from . import _render
    from ._compare import regressions
    from ._mlflow_runs import attach_comparison, compare_runs

    out = out or sys.stdout

    frame = compare_runs(args.runs or [], args.baseline, args.metric, args.step,
                         experiment=args.experiment, tracking_uri=args.tracking_uri)  # fmt: skip
    rendered = {
        "table": lambda: _render.text(frame, args.top),
        "markdown": lambda: _render.markdown(frame, args.top),
        "csv": lambda: _render.csv(frame),
        "json": lambda: _render.as_json(frame),
    }[args.format]()
    print(rendered, file=out)
    if args.log_to:
        with tempfile.TemporaryDirectory() as tmp:
            chart = _render.png(frame, Path(tmp, "comparison.png"))
            page = Path(tmp, "report.html")
            page.write_text(_render.html_page(frame, chart), encoding="utf-8")
            attach_comparison(args.tracking_uri or mlflow.get_tracking_uri(), args.log_to, frame, [chart, page])
        print(f"attached comparison/ops.json, comparison.png, report.html to run {args.log_to}", file=out)
    if args.fail_if_slower is None:
        return 0
    slower = regressions(frame, args.fail_if_slower, args.min_time_us)
    for r in slower:
        print(f"REGRESSION {r.run}: {r.op} {r.baseline_us:,.2f} -> {r.run_us:,.2f} us (+{r.percent:.1f}% > "
              f"{args.fail_if_slower}%) vs {frame.attrs['baseline']}", file=out)  # fmt: skip
    if not slower:
        print(f"no op or total is more than {args.fail_if_slower}% slower than {frame.attrs['baseline']}", file=out)
    return 1 if slower else 0


def annotate(args: argparse.Namespace, out=None) -> int:
    from ._registry import annotate_model_version

    out = out or sys.stdout

    tags = annotate_model_version(args.model, args.version, args.run, step=args.step, tracking_uri=args.tracking_uri)
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
    cap = None if args.max_file_mb is None else int(args.max_file_mb * 1024**2)
    run_id, cycles = ingest_path(Path(args.path), run, top_k=args.top_k, max_file_bytes=cap, out=out)
    if not args.run_id:
        MlflowClient(uri).set_terminated(run_id)
    print(f"ingested {cycles} cycle(s) from {args.path} into run {run_id}", file=out or sys.stdout)
    return 0


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
    cmp.add_argument("--step", type=int, help="profiler cycle to compare (default: each run's last)")
    cmp.add_argument("--top", type=int, default=15, help="ops shown in table/markdown (default: %(default)s)")
    cmp.add_argument("--format", default="table", choices=["table", "markdown", "csv", "json"])
    cmp.add_argument("--fail-if-slower", type=float, metavar="PCT", help="exit 1 if an op or the total is PCT%% slower")
    cmp.add_argument("--min-time-us", type=float, default=0.0, metavar="US",
                     help="the gate ignores ops below this time in both runs (the total is always checked)")
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
    ing.add_argument("--max-file-mb", type=float, help="larger files are listed, not uploaded (default: no cap)")
    ing.add_argument("--tracking-uri")

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
    ann.add_argument("--step", type=int, help="profiler cycle (default: the run's last)")
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
        return {"compare": compare, "annotate": annotate, "ingest": ingest}[args.command](args)
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
