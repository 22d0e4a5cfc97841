"""Writing a cycle into its MLflow run: `RunLogger.deliver(delivery)`, and finding that run.

Every delivery goes through here; large files through `uploads`, the cycle's trace through
`traces`. (Reading runs back is the read side's, Neuron system metrics are `system_metrics`'.)
Every call goes through one `MlflowClient` and an explicit run id: a profiler callback may run on
any thread, and MLflow's fluent API is thread-local (it would silently open a second run).
Sending a delivery twice leaves its data once: metric points are keyed by (key, step, timestamp,
value), artifacts overwrite, params and tags are re-set to the same values, and a cycle's trace
is found by its cycle key and not written again (`traces`).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from . import uploads
from .._record.model import DEVICE_TAG, MANIFEST, RUN_KEY_TAG, Delivery, RunRef
from .failures import check_reachable


def check_tracking_uri(tracking_uri: str) -> None:
    """Raises ValueError naming the schemes MLflow knows when `tracking_uri` is not one of them.

    MLflow's own error for this talks about the model registry, which hides the real mistake."""
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry
    from mlflow.utils.uri import get_uri_scheme

    known = set(registry._registry) - {""}
    scheme = tracking_uri if tracking_uri in {"databricks", "databricks-uc", "uc"} else get_uri_scheme(tracking_uri)
    if scheme and scheme not in known:
        raise ValueError(
            f"tracking_uri {tracking_uri!r} has an unknown scheme {scheme!r}; expected one of "
            f"{', '.join(sorted(known))} (e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db)"
        )


def current_run_ref(run_id: str | None, tracking_uri: str | None, **new_run: str | None) -> RunRef:
    """The run to log into: `run_id`, else the active run, else `MLFLOW_RUN_ID`, else a new one."""
    uri = tracking_uri or mlflow.get_tracking_uri()
    check_tracking_uri(uri)
    if run_id is None:
        active = mlflow.active_run()
        run_id = active.info.run_id if active else os.environ.get("MLFLOW_RUN_ID") or None
    if run_id is None and new_run.get("experiment_id") is None:
        new_run["experiment_id"] = mlflow.tracking.fluent._get_experiment_id() or "0"
    return RunRef(uri, run_id, **new_run)


class RunLogger:
    """Delivers cycles into one run, creating it on first use when it does not exist yet."""

    def __init__(self, run: RunRef, progress=None) -> None:
        self.run = run
        self.progress = progress  # where upload progress lines of large files go (default: logging)
        self.client = MlflowClient(run.tracking_uri)
        self._params: dict[str, str] | None = None
        self._tables: list[dict] | None = None  # the run's `mlflow.loggedArtifacts` entries
        self._run_info = None  # the run's RunInfo: experiment id and name, for cycle traces
        self.wrote = False  # whether anything was written to the server (a run created, data logged)

    def warm(self) -> None:
        """Opens the store and reads the run's state ahead of the first cycle (a sqlite store
        checks its schema on opening: a fraction of a second). Creates nothing; what fails here
        is left for the first delivery to meet and report."""
        try:
            if self.run.run_id is not None:
                self._load_run_state(self.run.run_id)
            elif self.run.experiment_id is not None:
                self.client.get_experiment(self.run.experiment_id)
        except Exception:  # noqa: BLE001
            pass

    def ensure_run(self) -> str:
        """The run's id; a run known by its key is found, or created once across processes.

        Search before creating, and again after: when two processes created a run for one key at
        once, both keep the first one made (earliest start, then smallest id) and the other is
        deleted by the process that made it, before anything is logged into it."""
        if self.run.run_id is None:
            found = self._runs_with_key()
            if not found:
                self.wrote = True
                created = self.client.create_run(
                    self.run.experiment_id, run_name=self.run.run_name, tags={RUN_KEY_TAG: self.run.run_key}
                )
                found = self._runs_with_key() or [created]
                if found[0].info.run_id != created.info.run_id:
                    self.client.delete_run(created.info.run_id)
            self.run = replace(self.run, run_id=found[0].info.run_id)
        return self.run.run_id

    def _runs_with_key(self) -> list:
        found = self.client.search_runs(
            [self.run.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{self.run.run_key}'"
        )
        return sorted(found, key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def deliver(self, delivery: Delivery, *, fresh: bool = False) -> tuple[dict[str, tuple[str, str]], list[str]]:
        """Sends one cycle. Returns param clashes {name: (kept, rejected)} and files that vanished.

        MLflow params are immutable, so a second profiler on the same run with other settings
        keeps the first values; the caller reports the clash. `fresh`: no earlier attempt can
        have written any of it (its trace is then written without a search first).
        """
        return self.deliver_many([delivery], fresh=fresh)[0]

    def deliver_many(self, deliveries: list[Delivery], *, fresh: bool = False) -> list[tuple[dict, list[str]]]:
        """Sends several cycles together: one artifact pass for their generated files, then their
        traces, then one `log_batch` for all their metrics and tags and the marks that say their
        traces are complete (last: a cycle whose metrics are in has everything in). Returns each
        cycle's (clashes, vanished), in order.

        As idempotent as one delivery: a batch that fails part way is sent again, whole or cycle
        by cycle, and leaves each cycle's data once."""
        check_reachable(self.run.tracking_uri)
        run_id = self.ensure_run()
        self._load_run_state(run_id)
        self.wrote = True  # what follows writes
        clashes = [self._log_params(run_id, d.params) for d in deliveries]
        vanished: list[list[str]] = [[] for _ in deliveries]
        sent: list[dict] = [{} for _ in deliveries]
        for d, gone, done in zip(deliveries, vanished, sent):
            for local_path, artifact_folder in d.uploads:
                if not os.path.isfile(local_path):
                    gone.append(local_path)
                    continue
                upload = uploads.upload(self.run.tracking_uri, run_id, local_path, artifact_folder, self.progress)
                done[upload.artifact_path] = upload
        self._log_generated_files(run_id, [d for d in deliveries if d.files_dir])
        for d, done in zip(deliveries, sent):
            if d.files_dir:
                self._log_checked_manifest(run_id, d, done)
        marks: list[Metric] = []
        self._log_timelines(run_id, deliveries, vanished, fresh, marks)
        metrics, tags = self._metrics_and_tags(deliveries)
        metrics += marks  # last: in MLflow's last chunk of a batch too large for one request
        if metrics or tags:
            self.client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()],
                                  synchronous=True)  # fmt: skip
        return list(zip(clashes, vanished))

    def _metrics_and_tags(self, deliveries: list[Delivery]) -> tuple[list[Metric], dict[str, str]]:
        """The cycles' metrics (each point once) and tags, the run's table list among them."""
        metrics, tags = [], {}
        for d in deliveries:
            metrics += [Metric(k, v, d.timestamp_ms, d.step) for k, v in d.metrics.items()]
            metrics += [Metric(k, v, d.timestamp_ms, step) for k, v, step in d.series]
            if d.summary_at is not None:
                metrics += [Metric(k, v, d.summary_at[1], d.summary_at[0]) for k, v in d.summary]
            tags.update(d.tags)  # in cycle order: the last cycle's value wins, as when sent one by one
            if d.table:
                tags[MLFLOW_LOGGED_ARTIFACTS] = self._register_table(d.table)
        return list({(m.key, m.value, m.timestamp, m.step): m for m in metrics}.values()), tags  # a point once per call

    def _log_generated_files(self, run_id: str, deliveries: list[Delivery]) -> None:
        """Every delivery's generated files under its own `artifact_dir` (a `placed` file at its
        own path), in one artifact pass: a folder of links laid out as the run's artifacts, logged
        at once."""
        if len(deliveries) == 1 and not deliveries[0].trace_spans and not deliveries[0].placed:
            self.client.log_artifacts(run_id, deliveries[0].files_dir, deliveries[0].artifact_dir)
            return
        with tempfile.TemporaryDirectory(prefix="mlflow-neuron-batch-") as root:
            for d in deliveries:
                placed = dict(d.placed)
                for folder, _, names in os.walk(d.files_dir):
                    relative = os.path.relpath(folder, d.files_dir)
                    target = Path(root, d.artifact_dir, relative)
                    target.mkdir(parents=True, exist_ok=True)
                    for name in names:  # artifact stores read through links (copytree, open, upload_file)
                        own = os.path.normpath(os.path.join(relative, name))
                        link = Path(root, placed[own]) if own in placed else target / name
                        link.parent.mkdir(parents=True, exist_ok=True)
                        if not (name == d.trace_spans and folder == d.files_dir):  # the trace's, not an artifact
                            os.symlink(os.path.abspath(os.path.join(folder, name)), link)
            self.client.log_artifacts(run_id, root)

    def _log_checked_manifest(self, run_id: str, delivery: Delivery, sent: dict) -> None:
        """manifest.json again, with the size and SHA-256 of the profile files just sent."""
        checked = uploads.manifest_with_checksums(delivery.files_dir, sent, MANIFEST)
        if checked is not None:
            with tempfile.TemporaryDirectory(prefix="mlflow-neuron-manifest-") as folder:
                Path(folder, MANIFEST).write_text(checked, encoding="utf-8")
                self.client.log_artifact(run_id, str(Path(folder, MANIFEST)), delivery.artifact_dir)

    def _log_timelines(self, run_id: str, deliveries: list[Delivery], vanished: list[list[str]], fresh: bool,
                       marks: list) -> None:  # fmt: skip
        """The cycles' traces, written and linked to the run, after their files; their marks of
        `complete` added to `marks`, which go with the cycles' metrics. Idempotent. A timeline
        file gone or damaged is added to its cycle's `vanished` (no trace then; retrying cannot
        help)."""
        from .._record.trace_text import TraceDraft, TraceText
        from .traces import log_timelines  # MLflow's tracing client: only for cycles with a timeline

        timelines = {}  # device tag -> timelines (one run: one device, but the tag is per cycle)
        for d, gone in zip(deliveries, vanished):
            if not (d.timeline and d.files_dir):
                continue
            path = Path(d.files_dir, d.trace_spans or d.timeline)  # the trace's data, when it was written ahead
            try:
                read = (TraceText.from_file_text(path.read_text(encoding="utf-8")) if d.trace_spans
                        else TraceDraft.from_json(path.read_bytes()))  # fmt: skip
                timelines.setdefault(d.tags.get(DEVICE_TAG), []).append(read)
            except (OSError, ValueError, TypeError, KeyError):
                gone.append(str(path))
        info = self._run_info
        for device, group in timelines.items():
            log_timelines(self.client, run_id, info.experiment_id, group, device=device, run_name=info.run_name,
                          fresh=fresh, marks=marks)  # fmt: skip

    def end_run(self) -> None:
        if self.run.run_id is not None:
            self.client.set_terminated(self.run.run_id, RunStatus.to_string(RunStatus.FINISHED))

    def _log_params(self, run_id: str, params: dict[str, str]) -> dict[str, tuple[str, str]]:
        new = {k: v for k, v in params.items() if k not in self._params}
        clashes = {k: (self._params[k], v) for k, v in params.items() if k in self._params and self._params[k] != v}
        if new:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in new.items()], synchronous=True)
            self._params.update(new)
        return clashes

    def _load_run_state(self, run_id: str) -> None:
        if self._params is None or self._tables is None:
            run = self.client.get_run(run_id)
            data, self._run_info = run.data, run.info
            self._params = dict(data.params)
            self._tables = json.loads(data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))

    def _register_table(self, path: str) -> str:
        """The `mlflow.loggedArtifacts` tag with `path` added, as `log_table` would set it.

        That tag is how the UI finds tables. A repeating schedule adds one table per cycle, so the
        oldest cycle tables are dropped from the tag (their files stay) to keep it under MLflow's
        tag length limit.
        """
        entry = {"path": path, "type": "table"}
        if entry not in self._tables:
            self._tables.append(entry)
        while len(json.dumps(self._tables)) > MAX_TAG_VAL_LENGTH:
            ours = [t for t in self._tables if t["path"].startswith("profiler/") and t != entry]
            if not ours:
                break
            self._tables.remove(ours[0])
        return json.dumps(self._tables)
