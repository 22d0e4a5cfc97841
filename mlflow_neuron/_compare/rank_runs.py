"""A run's rank summaries read back from MLflow, analysed across ranks (read only, but for `log_ranks`).

Example::

    ranks = read_ranks(run_id, tracking_uri)          # every rank's summary of every cycle
    report = ranks.report                             # `_compare.ranks.analyze`: waits, straggler
    report.to_json(), report.sentence, rank_summary(run_id)   # the last one: a DataFrame

Each rank of a job uploads one small JSON file per profiled cycle,
`profiler/ranks/rank_<r>/cycle_<step>.json` (the format is in docs/ranks.md). Only a reader sees
every rank, so the analysis happens here: the folder is downloaded at once (`download_folder`:
its rank folders listed and their files fetched side by side), each file checked, and the
summaries handed to `analyze`. A file that is not a rank summary of this format, or whose content
disagrees with its name, is left out and named (`RankRead.notes`); it never stops the others.
A run without the folder raises `NoRankSummaries` (a ValueError: the CLI's exit 2).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .._compare.runs import RunNotFound, labels
from .._trace.collectives import FORMAT, VERSION

RANKS_FOLDER = "profiler/ranks"  # every rank's folder of summaries (`_record.model.RANK_SUMMARY`)
_FILE = re.compile(r"^rank_(\d+)/cycle_(\d+)\.json$")
STRAGGLER_METRIC = "profiler/ranks/straggler"  # the straggler's rank; NO_STRAGGLER where none stands out
SKEW_METRIC = "profiler/ranks/step_time_skew_pct"
WAIT_METRIC = "profiler/ranks/median_wait_us"
NO_STRAGGLER = -1
STRAGGLER_HOST_TAG = "mlflow_neuron.ranks.straggler_host"
LOGGED_FOLDER = "ranks"  # what `log_ranks` attaches: ranks.png, ranks.json
FETCHERS = 8  # requests at once: each a rank folder's listing or a file


class NoRankSummaries(ValueError):
    """The run holds no rank summaries (profiled before they existed, or not by mlflow-neuron)."""


@dataclass
class RankRead:
    """What was read from one run: the summaries that passed the checks, and what did not."""

    run_id: str
    summaries: list[dict]
    notes: list[str] = field(default_factory=list)  # files left out, and why
    cycles: list[int] = field(default_factory=list)
    _report: object = None

    @property
    def world_size(self) -> int:
        """The job's world size as the ranks reported it (the largest, should they disagree)."""
        return max(int(s.get("world_size") or 1) for s in self.summaries)

    @property
    def report(self):
        """`analyze`'s `RankReport` over every summary read, analysed once."""
        if self._report is None:
            from .._compare.ranks import analyze

            self._report = analyze(self.summaries, expected_world_size=self.world_size)
        return self._report

    @property
    def report_json(self) -> dict:
        """The report in the issue's JSON shape (`ranks --format json`)."""
        return self.report.to_json()

    def closing_lines(self) -> list[str]:
        """What `ranks` prints under its table: the sentence (it names ranks that sent nothing), the
        collectives not matched across ranks, and what was left out."""
        from .._compare.rank_text import closing_lines

        report = self.report
        return closing_lines(report.sentence, list(report.unmatched), [*report.notes, *self.notes])


def rank_picture(read: RankRead, path: Path) -> Path:
    """The run's picture (`rank_chart`): each rank's step split into compute, collective, wait, idle."""
    from .._compare import rank_chart

    report = read.report
    straggler = (report.straggler or {}).get("rank")
    title = f"run {read.run_id}: {report.world_size} rank(s). {report.sentence.rstrip('.')}."
    return rank_chart.png(rank_chart.step_split(report.steps), path, title, straggler)


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
        summaries, notes = parse_folder(folder)
    cycles = sorted({s["cycle_step"] for s in summaries})
    if step is not None:
        if step not in cycles:
            raise NoRankSummaries(f"run {run_id} has no rank summaries at step {step}; steps that have: "
                                  f"{', '.join(map(str, cycles)) or 'none'}")  # fmt: skip
        summaries, cycles = [s for s in summaries if s["cycle_step"] == step], [step]
    if not summaries:
        raise NoRankSummaries(f"run {run_id} has no readable rank summaries: {'; '.join(notes)}")
    return RankRead(run_id, summaries, notes, cycles)


def rank_changes(client: MlflowClient, runs: list, baseline: str,
                 step: int | None = None) -> tuple[dict[str, str], dict[str, dict]]:  # fmt: skip
    """For a comparison of `runs` against the run labelled `baseline` (`runs.labels`): where each
    run's step-time change came from across ranks (`ranks.explain_change`), for the runs that have
    rank summaries as the baseline does; and each such run's report (`to_json()`), by label."""
    from .._compare.ranks import explain_change

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


def parse_folder(folder: Path) -> tuple[list[dict], list[str]]:
    """The rank summaries under a downloaded `profiler/ranks/`, in (rank, cycle) order, and a note per
    file left out."""
    found, notes = [], []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        summary, problem = _checked(path, name)
        if problem:
            notes.append(f"{RANKS_FOLDER}/{name} left out: {problem}")
        else:
            found.append(summary)
    found.sort(key=lambda s: (s["rank"], s["cycle_step"]))
    return found, notes


def _checked(path: Path, name: str) -> tuple[dict | None, str | None]:
    """(the summary, None), or (None, why it cannot be used)."""
    match = _FILE.match(name)
    if not match:
        return None, "not named rank_<r>/cycle_<step>.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"not JSON ({error})"
    if not isinstance(summary, dict) or summary.get("format") != FORMAT:
        return None, f"not a rank summary (format is not {FORMAT!r})"
    if summary.get("version") != VERSION:
        return None, f"format version {summary.get('version')!r}, this mlflow-neuron reads {VERSION}"
    rank, cycle = int(match.group(1)), int(match.group(2))
    if summary.get("rank") != rank or summary.get("cycle_step") != cycle:
        return None, (f"it says rank {summary.get('rank')!r}, cycle {summary.get('cycle_step')!r}; its name says "
                      f"rank {rank}, cycle {cycle}")  # fmt: skip
    if not isinstance(summary.get("steps"), list) or not isinstance(summary.get("collectives"), list):
        return None, "no steps or collectives lists"
    return summary, None


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


def run_metrics(report: dict) -> dict[str, float]:
    """The run-level numbers of a `to_json()` report: the straggler, the step-time skew across
    ranks, and the median wait (of the ranks' medians per step)."""
    ranks = report["ranks"]
    medians = [r["step_time_us"]["median"] for r in ranks if r["step_time_us"]["median"] is not None]
    waits = [r["wait_us"] for r in ranks if r.get("wait_us") is not None]
    found = {STRAGGLER_METRIC: float(report["straggler"]["rank"]) if report.get("straggler") else float(NO_STRAGGLER)}
    if medians and min(medians) > 0:
        found[SKEW_METRIC] = (max(medians) - min(medians)) / min(medians) * 100
    if waits:
        found[WAIT_METRIC] = float(pd.Series(waits).median())
    return found


def log_ranks(tracking_uri: str, run_id: str, report: dict, files: list[Path]) -> dict[str, float]:
    """Logs the run-level metrics, the straggler's host as a tag, and `files` under `ranks/` of
    `run_id` (replacing an earlier call's); returns the metrics."""
    from .._delivery.mlflow_io import RunLogger
    from .._record.model import Delivery, RunRef

    metrics = run_metrics(report)
    host = (report.get("straggler") or {}).get("host")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "ranks.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        for path in files:
            Path(tmp, Path(path).name).write_bytes(Path(path).read_bytes())
        delivery = Delivery(step=0, timestamp_ms=int(time.time() * 1000), artifact_dir=LOGGED_FOLDER, files_dir=tmp, metrics=metrics,
                            tags={STRAGGLER_HOST_TAG: host or "none"})  # fmt: skip
        RunLogger(RunRef(tracking_uri, run_id)).deliver(delivery)
    return metrics
