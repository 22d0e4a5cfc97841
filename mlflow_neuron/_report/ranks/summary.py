"""A run's ranks as a table, and the ranks behind a comparison's step-time change (read, then analysed).

Example::

    table = rank_summary("0123abcd...")      # one row per rank, as `mlflow-neuron ranks` prints it
    table.attrs["straggler"], table.attrs["sentence"]
    explained, reports = rank_changes(client, runs, baseline="v1")   # for `compare_runs`
"""

from __future__ import annotations

import pandas as pd
from mlflow.tracking import MlflowClient

from ..._analysis.ranks.change import explain_change
from ..._readback.ranks import NoRankSummaries, read_ranks, read_run
from ..._readback.runs import labels


def rank_summary(run_id: str, tracking_uri: str | None = None, step: int | None = None) -> pd.DataFrame:
    """One row per rank of a profiled run: its step time, time in collectives, wait, exposed
    communication and idle shares, host (the table `mlflow-neuron ranks` prints).

    Example::

        table = rank_summary("0123abcd...")
        table.attrs["straggler"], table.attrs["sentence"]

    `attrs` also hold `world_size`, `missing` (ranks that sent nothing), `unmatched` (collectives
    not matched across ranks) and `notes` (files left out). Raises RunNotFound for an unknown run and
    NoRankSummaries (a ValueError) for a run without rank summaries.
    """
    read = read_ranks(run_id, tracking_uri, step)
    report = read.report
    table = report.table.copy()
    table.attrs = {"world_size": read.world_size, "straggler": report.straggler, "sentence": report.sentence,
                   "missing": list(report.missing), "unmatched": list(report.unmatched), "notes": read.notes,
                   "cycles": read.cycles}  # fmt: skip
    return table


def rank_changes(client: MlflowClient, runs: list, baseline: str,
                 step: int | None = None) -> tuple[dict[str, str], dict[str, dict]]:  # fmt: skip
    """For a comparison of `runs` against the run labelled `baseline` (`runs.labels`): where each
    run's step-time change came from across ranks (`ranks.explain_change`), for the runs that have
    rank summaries as the baseline does; and each such run's report (`to_json()`), by label."""
    reads = {}
    for run, name in zip(runs, labels(runs)):
        try:
            reads[name] = read_run(client, run, step)
        except NoRankSummaries:
            continue
    base = reads.get(baseline)
    if base is None:
        return {}, {name: read.report_json for name, read in reads.items()}
    explained = {name: explain_change(base.report, read.report) for name, read in reads.items() if name != baseline}
    return ({name: text for name, text in explained.items() if text},
            {name: read.report_json for name, read in reads.items()})
