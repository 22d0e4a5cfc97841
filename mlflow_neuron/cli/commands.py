"""The command line's commands, each a function (args) -> exit code. Each imports what it needs
when it runs: MLflow and torch only load for a command that got as far as doing its work."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._delivery import outbox as _outbox
from .arguments import EXIT_BUSY, EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE


def sync(outbox: str, tracking_uri: str | None = None, out=None, *, retry_rejected: bool = False,
         retry_damaged: bool = False, run_id: str | None = None, err=None):  # fmt: skip
    """Replays outbox records into their runs, removing each one delivered; returns a `SyncResult`
    (`exit_code(result)` is the command's exit code).

    Idempotent: a record sent twice (a second sync, or one after a partial replay) leaves every
    metric point and artifact once. A record the server refuses for good (the run does not exist
    or was deleted, permission denied, an invalid value) moves to `<outbox>/rejected/` with a
    `reason` file; those are only sent again with `retry_rejected`, into `run_id` if given. A record
    whose files fail the size and SHA-256 taken when it was written moves to `<outbox>/damaged/`
    and is never sent; `retry_damaged` checks those again. A run that the callback created is
    ended (FINISHED) once all its records are in; a run it was given is left as it is. A second sync
    on the same outbox does nothing and says which process holds it.
    """
    from .._delivery.sync import sync_outbox

    return sync_outbox(outbox, tracking_uri, out, retry_rejected=retry_rejected, retry_damaged=retry_damaged,
                       run_id=run_id, err=err)  # fmt: skip


def exit_code(result) -> int:
    """`sync`'s exit code: 2 the outbox was refused, 5 another sync holds it, 3 a server did not
    answer and nothing was changed, 1 records were kept or found damaged."""
    if result.refused:
        return EXIT_USAGE
    if result.busy:
        return EXIT_BUSY
    if result.unreachable and not result.changed:
        return EXIT_UNREACHABLE
    return EXIT_FAILED if result.kept or result.damaged else EXIT_OK


def sync_command(args: argparse.Namespace, out=None) -> int:
    outbox = args.outbox or _outbox.DEFAULT_OUTBOX
    if args.outbox is None and not Path(outbox).is_dir():
        print(f"nothing to sync: no outbox at ./{outbox}", file=out or sys.stdout)
        return EXIT_OK
    from .._delivery.http_budget import remember_retry_after

    remember_retry_after()  # the command's own process: a refusal's Retry-After is kept for the next drain
    result = sync(outbox, args.tracking_uri, out, retry_rejected=args.retry_rejected,
                  retry_damaged=args.retry_damaged, run_id=args.run_id)  # fmt: skip
    return exit_code(result)


def compare(args: argparse.Namespace, out=None) -> int:
    import tempfile

    import mlflow

    from .._report import render as _render
    from .._report.comparison import compare_runs
    from .._readback.profiles import load_timelines
    from .._report.publish import attach_comparison

    out = out or sys.stdout
    frame = compare_runs(args.runs or [], args.baseline, args.metric, args.step, experiment=args.experiment,
                         tracking_uri=args.tracking_uri, skip_steps=args.skip_steps, noise_pct=args.noise_pct,
                         host_load_threshold=args.host_load_threshold, region=args.region,
                         host_busy_share=args.host_busy_share, detail=args.detail,
                         fail_if_slower=args.fail_if_slower, tables=args.tables)
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
    code = EXIT_OK if args.fail_if_slower is None else _gate(frame, args.fail_if_slower, args.min_time_us, out)
    if code == EXIT_OK and args.fail_if_inconclusive:
        return _inconclusive(frame, args.fail_if_slower is None, out)
    return code


def _gate(frame, percent: float, min_us: float, out) -> int:
    """Exit 1 only for a row whose whole interval (`gate.gate_lines`) lies above +percent; print that interval."""
    from .._analysis.gate import gate_lines

    failed, lines = gate_lines(frame, percent, min_us)
    for line in lines:
        print(line, file=out)
    return EXIT_FAILED if failed else EXIT_OK


def _inconclusive(frame, print_lines: bool, out) -> int:
    """Exit 4 when some run's host time was not judged (the gate has printed why, if it ran)."""
    from .._analysis.gate import inconclusive_runs

    found = inconclusive_runs(frame)
    if print_lines:
        for run, why in found.items():
            print(f"INCONCLUSIVE {run}: {why}", file=out)
    return EXIT_INCONCLUSIVE if found else EXIT_OK


def annotate(args: argparse.Namespace, out=None) -> int:
    from .._report.publish import annotate_model_version

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

    from .._capture.ingest import ingest as ingest_path
    from .._record.model import RunRef

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
    from .._readback.runs import download_neuron_files
    from .._neuron.explorer import open_in_explorer, opened_profile

    step, neuron_dir = download_neuron_files(args.run, args.step, args.dest, args.tracking_uri)
    return open_in_explorer(opened_profile(args.run, step, neuron_dir), launch=not args.no_launch, out=out)


def history(args: argparse.Namespace, out=None) -> int:
    """The series, its changes, and the gate: exit 1 when the latest change made it slower beyond +PCT."""
    import tempfile

    import mlflow

    from .._report import history_text as report
    from .._report.history import history_runs

    out = out or sys.stdout
    frame = history_runs(args.experiment, run_name=args.run_name, filter_string=args.filter, metric=args.metric,
                         region=args.region, op=args.op, tracking_uri=args.tracking_uri, noise_pct=args.noise_pct,
                         summaries=not args.tables, progress=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    rendered = {"table": report.text, "markdown": report.markdown, "csv": lambda f: f.to_csv(index=False),
                "json": report.as_json}[args.format](frame)  # fmt: skip
    print(rendered, file=out)
    if args.log_to:
        from .._report.publish import attach_files

        with tempfile.TemporaryDirectory() as tmp:
            chart = report.png(frame, Path(tmp, "history.png"))
            Path(tmp, "history.html").write_text(report.html_page(frame, chart), encoding="utf-8")
            Path(tmp, "history.json").write_text(report.as_json(frame), encoding="utf-8")
            attach_files(args.tracking_uri or mlflow.get_tracking_uri(), args.log_to,
                         [Path(tmp, name) for name in ("history.png", "history.html", "history.json")], "history")
        print(f"attached history/history.png, history.html and history.json to run {args.log_to}", file=out)
    if args.fail_on_change is None:
        return EXIT_OK
    latest = frame.attrs["changes"][-1] if frame.attrs["changes"] else None  # the one the latest segment starts with
    if latest and latest["verdict"] == "slower" and latest["ratio_low"] > 1 + args.fail_on_change / 100:
        print(f"CHANGE {latest['before_commit'] or latest['before_run_name']} -> "
              f"{latest['after_commit'] or latest['after_run_name']}: ratio {latest['ratio']:.2f} (95% CI "
              f"{latest['ratio_low']:.2f}\u2013{latest['ratio_high']:.2f}) > +{args.fail_on_change:g}%", file=out)  # fmt: skip
        return EXIT_FAILED
    print(f"no change in the latest segment is proven more than {args.fail_on_change:g}% slower (95% interval)",
          file=out)  # fmt: skip
    return EXIT_OK


def ranks(args: argparse.Namespace, out=None) -> int:
    """Every rank of a run in a table (or JSON), the straggler in a sentence; with --log-to, the
    picture, the JSON and the run-level metrics attached to that run."""
    import json
    import tempfile

    import mlflow

    from .._readback.ranks import read_ranks
    from .._report.ranks import text as rank_text
    from .._report.ranks.chart import rank_picture
    from .._report.ranks.publish import log_ranks

    out = out or sys.stdout
    uri = args.tracking_uri or mlflow.get_tracking_uri()
    read = read_ranks(args.run, uri, args.step)
    report = read.report_json
    rendered = {"table": lambda: rank_text.text(report, args.run, rank_text.closing_lines_of(read)),
                "markdown": lambda: rank_text.markdown(report, args.run, rank_text.closing_lines_of(read)),
                "json": lambda: json.dumps(report, indent=1)}[args.format]()  # fmt: skip
    print(rendered, file=out)
    if args.log_to:
        with tempfile.TemporaryDirectory() as tmp:
            picture = rank_picture(read, Path(tmp, "ranks.png"))
            metrics = log_ranks(uri, args.log_to, report, [picture])
        shown = ", ".join(f"{k} = {v:g}" for k, v in metrics.items())
        print(f"attached ranks/ranks.png and ranks.json to run {args.log_to}; logged {shown}", file=out)
    return EXIT_OK


# Each command: a function (args) -> exit code. Errors they raise are mapped to exit codes in main().
def capture(args: argparse.Namespace, out=None) -> int:
    """Asks the job writing a RUNNING run to profile its next steps (`_record.capture_request`)."""
    import uuid

    from mlflow.tracking import MlflowClient

    from .._record.capture_request import PLAN_TAG, REQUEST_TAG, Request, now_iso, request_value

    client = MlflowClient(args.tracking_uri)
    run = client.get_run(args.run)
    if run.info.status != "RUNNING":
        raise ValueError(f"run {args.run} is {run.info.status}: no job is writing it, so nothing can capture")
    schedule = run.data.params.get("profiler.schedule")
    if schedule is not None and schedule != "callback.schedule()":
        raise ValueError(f"run {args.run} profiles on a schedule of its own (profiler.schedule={schedule}); "
                         "only callback.schedule() captures on request")  # fmt: skip
    request = Request(id=uuid.uuid4().hex[:12], steps=args.steps, at=now_iso(), by="capture")
    client.set_tag(args.run, REQUEST_TAG, request_value(request))
    print(f"asked run {args.run} to profile {args.steps} step(s) (request {request.id}); the job answers in tag "
          f"{PLAN_TAG}", file=out or sys.stdout)  # fmt: skip
    return EXIT_OK


COMMANDS = {"sync": sync_command, "compare": compare, "annotate": annotate, "ingest": ingest, "open": open_session,
            "history": history, "ranks": ranks, "capture": capture}
