"""What one cycle sends to MLflow, decided without talking to MLflow.

A `CycleRecord` is plain data: metrics, tags, the op table and the files to upload. Keeping it
separate from the I/O lets the same record be logged now, retried, or replayed later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import _files
from ._extract import KERNEL, OP, CycleProfile
from ._keys import OpKeys, metric_key, total_key

DEVICE_TAG = "mlflow_neuron.device"
DEVICE_TIME_TAG = "mlflow_neuron.device_time"

OPS_TABLE = "ops.json"

PER_OP_METRICS = ("self_device_time_us", "self_cpu_time_us", "calls")


@dataclass(frozen=True)
class CycleRecord:
    step: int
    timestamp_ms: int
    artifact_dir: str  # "profiler/step_<N>"
    metrics: dict[str, float]
    tags: dict[str, str]
    staged_dir: Path  # generated files (ops.json among them), uploaded as they lie under artifact_dir
    uploads: tuple[tuple[Path, str], ...] = field(default=())  # (local file, artifact subfolder)


def cycle_metrics(profile: CycleProfile, keys: OpKeys, top_k: int, rank_prefix: str = "") -> dict[str, float]:
    """Per-op metrics for the `top_k` costliest host ops, plus the cycle's totals."""
    # Every host op is keyed, not just the top ones, so which name wins a clash never depends on k.
    op_keys = keys.keys([op.name for op in profile.ops if op.kind == OP])
    top = profile.top_ops(top_k)
    metrics = {}
    for op in top:
        for kind in PER_OP_METRICS:
            metrics[metric_key(kind, op_keys[op.name], rank_prefix)] = float(getattr(op, kind))
    totals = {
        "self_device_time_us": profile.total_self_device_time_us,
        "self_cpu_time_us": profile.total_self_cpu_time_us,
        "unattributed_device_time_us": max(
            profile.total_self_device_time_us - profile.attributed_device_time_us, 0.0
        ),
        "aten_calls": profile.aten_calls,
        "active_steps": profile.active_steps,
    }
    metrics.update({total_key(kind, rank_prefix): float(v) for kind, v in totals.items()})
    return metrics


def ops_table(profile: CycleProfile, keys: OpKeys) -> pd.DataFrame:
    """Every op of the cycle with the metric key it has (or would have) under `profiler/...`."""
    frame = profile.to_frame()
    host_ops = [op.name for op in profile.ops if op.kind == OP]
    key_of = keys.keys(host_ops)
    frame.insert(2, "metric_key", [key_of.get(n, "") if k == OP else "" for n, k in zip(frame.name, frame.kind)])
    total = profile.total_self_device_time_us
    frame["share_of_device_time"] = frame.self_device_time_us / total if total else 0.0
    # Kernel rows repeat time their op rows already carry; the share column is only for op rows.
    frame.loc[frame.kind == KERNEL, "share_of_device_time"] = 0.0
    return frame


def write_ops_table(frame: pd.DataFrame, path: Path) -> None:
    """Writes the table in the layout `MlflowClient.log_table` uses, so the UI shows it as one."""
    frame.to_json(path, orient="split", index=False, date_format="iso")


def manifest(
    found: list[_files.FoundFile],
    *,
    output_dir: str | None,
    trace_source: str | None,
    max_file_bytes: int,
) -> str:
    entries = [
        {
            "artifact_path": f"neuron/{f.relative_path}",
            "source": str(f.path),
            "size_bytes": f.size_bytes,
            "uploaded": f.decision == _files.UPLOAD,
            "reason": None if f.decision == _files.UPLOAD else f.decision,
        }
        for f in found
    ]
    return json.dumps(
        {
            "profile_output_dir": output_dir,
            "max_file_bytes": max_file_bytes,
            "framework_trace": trace_source,
            "files": entries,
        },
        indent=2,
    )
