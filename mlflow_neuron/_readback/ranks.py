"""A run's rank summaries read back from MLflow (read only).

Example::

    ranks = read_ranks(run_id, tracking_uri)          # every rank's summary of every cycle
    report = ranks.report                             # `_analysis.ranks.analysis.analyze`: waits, straggler

The consumer of each node of a job uploads one Parquet file per profiled cycle holding every local
rank's summary, `profiler/ranks/node_<host>/cycle_<step>_rank_<first>.parquet`; runs logged
before them hold one JSON file per rank per cycle, `profiler/ranks/rank_<r>/cycle_<step>.json`
(the formats are in docs/ranks.md). Only a reader sees every rank, so the analysis happens here: the
folder is downloaded at once (`download_folder`: its node and rank folders listed and their files
fetched side by side), each file checked (`rank_files`), and the summaries and their collectives,
one table, handed to `analyze` (once, when `report` is first asked for). A file that is not a rank
summary or node file of a format read here, or whose content disagrees with its name, is left out
and named (`RankRead.notes`); it never stops the others. A run without the folder raises
`NoRankSummaries` (a ValueError: the CLI's exit 2).
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .rank_files import parse_folder
from .runs import RunNotFound
from .._record.model import RANKS_FOLDER, capture_reasons

FETCHERS = 8  # requests at once: each a rank folder's listing or a file


class NoRankSummaries(ValueError):
    """The run holds no rank summaries (profiled before they existed, or not by mlflow-neuron)."""


@dataclass
class RankRead:
    """What was read from one run: the summaries that passed the checks (without their
    `collectives`), their collectives as one table (`frames.FRAME_COLUMNS`), and what did not pass."""

    run_id: str
    summaries: list[dict]
    collectives: pd.DataFrame
    notes: list[str] = field(default_factory=list)  # files left out, and why
    cycles: list[int] = field(default_factory=list)
    capture_reasons: dict[int, str] = field(default_factory=dict)  # why each cycle read was captured, where said
    _report: object = None

    @property
    def world_size(self) -> int:
        """The job's world size as the ranks reported it (the largest, should they disagree)."""
        return max(int(s.get("world_size") or 1) for s in self.summaries)

    @property
    def report(self):
        """`analyze`'s `RankReport` over every summary read, analysed once."""
        if self._report is None:
            from .._analysis.ranks.analysis import analyze

            self._report = analyze(self.summaries, collectives=self.collectives, expected_world_size=self.world_size)
        return self._report

    @property
    def report_json(self) -> dict:
        """The report in the issue's JSON shape (`ranks --format json`)."""
        return self.report.to_json()



def read_ranks(run_id: str, tracking_uri: str | None = None, step: int | None = None,
               client: MlflowClient | None = None) -> RankRead:  # fmt: skip
    """Every rank summary of the run (of cycle `step` only, if given), checked.

    Raises RunNotFound for an unknown run, NoRankSummaries when it has none (at that step)."""
    client = client or MlflowClient(tracking_uri)
    return read_run(client, _run(client, run_id), step)


def read_run(client: MlflowClient, run, step: int | None = None) -> RankRead:
    """`read_ranks` of a run already found."""
    run_id = run.info.run_id
    with tempfile.TemporaryDirectory(prefix="mlflow-neuron-ranks-") as tmp:
        folder = download_folder(client, run, Path(tmp))
        if folder is None:
            raise NoRankSummaries(f"run {run_id} has no rank summaries (no {RANKS_FOLDER}/ artifacts): it was profiled "
                                  "without them, by an older mlflow-neuron or from elsewhere")  # fmt: skip
        summaries, collectives, notes = parse_folder(folder)
    cycles = sorted({s["cycle_step"] for s in summaries})
    if step is not None:
        if step not in cycles:
            raise NoRankSummaries(f"run {run_id} has no rank summaries at step {step}; steps that have: "
                                  f"{', '.join(map(str, cycles)) or 'none'}")  # fmt: skip
        summaries, cycles = [s for s in summaries if s["cycle_step"] == step], [step]
        collectives = collectives[(collectives["cycle"] == step).to_numpy(bool)].reset_index(drop=True)
    if not summaries:
        raise NoRankSummaries(f"run {run_id} has no readable rank summaries: {'; '.join(notes)}")
    reasons = {c: why for c, why in capture_reasons(run.data.tags).items() if c in cycles}
    return RankRead(run_id, summaries, collectives, notes, cycles, reasons)


def _run(client: MlflowClient, run_id: str):
    try:
        return client.get_run(run_id)
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunNotFound(f"no such run: {run_id}") from error
        raise


def download_folder(client: MlflowClient, run, dest: Path) -> Path | None:
    """The run's `profiler/ranks/` downloaded under `dest` at once (None: the run has none).

    One listing of the folder, then its rank folders listed and their files fetched `FETCHERS` at a
    time through one handle on the run's artifact store: each request waits on the server most of
    its time, and MLflow's own `download_artifacts` lists the rank folders one after another (64
    ranks: 65 listings in a row before the first file)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=client.tracking_uri)
    top = repo.list_artifacts(RANKS_FOLDER)
    if not top:
        return None
    with ThreadPoolExecutor(FETCHERS) as pool:
        listed = pool.map(lambda item: repo.list_artifacts(item.path) if item.is_dir else [item], top)
        files = [item.path for found in listed for item in found if not item.is_dir]
        for path in files:
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
        list(pool.map(lambda path: _fetch(repo, path, dest), files))
    return dest / RANKS_FOLDER


def _fetch(repo, path: str, dest: Path) -> None:
    """One listed file, to `dest/path`, in one request where the store allows (every MLflow store
    has `_download_file`; the public call lists the path again first)."""
    fetch = getattr(repo, "_download_file", None)
    if fetch is None:
        repo.download_artifacts(path, str(dest))
    else:
        fetch(path, str(dest / path))
