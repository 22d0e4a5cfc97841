"""`mlflow-neuron` command line.

    mlflow-neuron sync [--outbox DIR] [--tracking-uri URI]

Exit codes: 0 done, 1 some work could not be done (kept for a later try), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__, _outbox


def sync(outbox: str, tracking_uri: str | None = None, out=sys.stdout) -> tuple[int, int]:
    """Replays outbox records into their runs, removing each one delivered.

    Idempotent: a record sent twice (a second sync, or one after a partial replay) leaves every
    metric point and artifact once. Returns (delivered, kept).
    """
    from dataclasses import replace

    from ._mlflow_io import RunLogger

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sync":
        _, kept = sync(args.outbox, args.tracking_uri)
        return 1 if kept else 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
