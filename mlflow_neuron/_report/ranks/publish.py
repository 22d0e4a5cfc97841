"""`mlflow-neuron ranks --log-to`: a run's rank analysis written back to MLflow (through `_delivery`).

Example::

    log_ranks(tracking_uri, run_id, read.report_json, [png])   # ranks/ranks.png, ranks.json, the metrics

The names it writes under are `_record.model`'s (`RANKS_*`, `STRAGGLER_HOST_TAG`).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from ..._delivery.mlflow_io import RunLogger
from ..._record.model import (
    NO_STRAGGLER,
    RANKS_LOGGED_FOLDER,
    RANKS_SKEW_METRIC,
    RANKS_STRAGGLER_METRIC,
    RANKS_WAIT_METRIC,
    STRAGGLER_HOST_TAG,
    Delivery,
    RunRef,
)


def run_metrics(report: dict) -> dict[str, float]:
    """The run-level numbers of a `to_json()` report: the straggler, the step-time skew across
    ranks, and the median wait (of the ranks' medians per step)."""
    ranks = report["ranks"]
    medians = [r["step_time_us"]["median"] for r in ranks if r["step_time_us"]["median"] is not None]
    waits = [r["wait_us"] for r in ranks if r.get("wait_us") is not None]
    found = {RANKS_STRAGGLER_METRIC: float(report["straggler"]["rank"]) if report.get("straggler") else float(NO_STRAGGLER)}
    if medians and min(medians) > 0:
        found[RANKS_SKEW_METRIC] = (max(medians) - min(medians)) / min(medians) * 100
    if waits:
        found[RANKS_WAIT_METRIC] = float(pd.Series(waits).median())
    return found


def log_ranks(tracking_uri: str, run_id: str, report: dict, files: list[Path]) -> dict[str, float]:
    """Logs the run-level metrics, the straggler's host as a tag, and `files` under `ranks/` of
    `run_id` (replacing an earlier call's); returns the metrics."""
    metrics = run_metrics(report)
    host = (report.get("straggler") or {}).get("host")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "ranks.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        for path in files:
            Path(tmp, Path(path).name).write_bytes(Path(path).read_bytes())
        delivery = Delivery(step=0, timestamp_ms=int(time.time() * 1000), artifact_dir=RANKS_LOGGED_FOLDER, files_dir=tmp, metrics=metrics,
                            tags={STRAGGLER_HOST_TAG: host or "none"})  # fmt: skip
        RunLogger(RunRef(tracking_uri, run_id)).deliver(delivery)
    return metrics
