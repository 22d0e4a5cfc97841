"""The only module that talks to MLflow.

Every call goes through one `MlflowClient` and an explicit run id: a profiler callback may run on
any thread, and MLflow's fluent API is thread-local (it would silently open a second run).
"""

from __future__ import annotations

import json

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from ._record import OPS_TABLE, CycleRecord


class RunLogger:
    """Logs cycle records into one run: the given one, the active one, or one it creates."""

    def __init__(
        self,
        *,
        run_id: str | None = None,
        tracking_uri: str | None = None,
        experiment_id: str | None = None,
        run_name: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri or mlflow.get_tracking_uri()
        self.client = MlflowClient(self.tracking_uri)
        active = mlflow.active_run() if run_id is None else None
        self.run_id = run_id or (active.info.run_id if active else None)
        self._experiment_id = experiment_id
        self._run_name = run_name
        self.owns_run = False
        self._logged_params: dict[str, str] | None = None
        self._tables: list[dict] | None = None  # the run's `mlflow.loggedArtifacts` entries

    def ensure_run(self) -> str:
        """The run id, creating the run on first use (so constructing costs no request)."""
        if self.run_id is None:
            experiment_id = self._experiment_id or mlflow.tracking.fluent._get_experiment_id() or "0"
            run = self.client.create_run(experiment_id, run_name=self._run_name)
            self.run_id = run.info.run_id
            self.owns_run = True
        return self.run_id

    def log_params_once(self, params: dict[str, str]) -> dict[str, tuple[str, str]]:
        """Logs params the run lacks; returns {name: (kept, rejected)} for values that differ.

        MLflow params are immutable, so a second profiler on the same run with other settings
        keeps the first values; the caller reports the clash.
        """
        run_id = self.ensure_run()
        self._load_run_state(run_id)
        new = {k: v for k, v in params.items() if k not in self._logged_params}
        clashes = {
            k: (self._logged_params[k], v)
            for k, v in params.items()
            if k in self._logged_params and self._logged_params[k] != v
        }
        if new:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in new.items()], synchronous=True)
            self._logged_params.update(new)
        return clashes

    def log_cycle(self, record: CycleRecord) -> None:
        run_id = self.ensure_run()
        self._load_run_state(run_id)
        metrics = [Metric(k, v, record.timestamp_ms, record.step) for k, v in record.metrics.items()]
        tags = [RunTag(k, v) for k, v in record.tags.items()]
        tags.append(RunTag(MLFLOW_LOGGED_ARTIFACTS, self._register_table(f"{record.artifact_dir}/{OPS_TABLE}")))
        self.client.log_batch(run_id, metrics=metrics, tags=tags, synchronous=True)
        for local_path, subfolder in record.uploads:
            self.client.log_artifact(run_id, str(local_path), f"{record.artifact_dir}/{subfolder}")
        self.client.log_artifacts(run_id, str(record.staged_dir), record.artifact_dir)

    def _load_run_state(self, run_id: str) -> None:
        if self._logged_params is None or self._tables is None:
            data = self.client.get_run(run_id).data
            self._logged_params = dict(data.params)
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
            ours = [t for t in self._tables if t["path"].startswith("profiler/") and t is not entry]
            if not ours:
                break
            self._tables.remove(ours[0])
        return json.dumps(self._tables)

    def end_run(self) -> None:
        if self.owns_run and self.run_id is not None:
            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))
            self.owns_run = False
