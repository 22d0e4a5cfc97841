"""What a comparison writes back to MLflow (with `ranks.publish`, the only read-side modules that write).

`attach_comparison` logs a comparison's table and rendered files under a run's `comparison/` and
`describe_run` puts its verdicts in words into the run's description. `annotate_model_version`
tags a registered model version with its run's profile: tags (`perf.*`, string values: registry
tags are searchable with `=`/`LIKE`) and a short markdown table in the description. Descriptions
get their block between markers, so writing again replaces its own block and leaves the user's
text alone; annotating twice gives the same version. Numbers are medians per profiled step;
`perf.top_op` names a real op, never a wrapper range. With a baseline run the version also gets
`perf.verdict` and the verdict in words.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient

from .._analysis.frame import compare, flat
from .._analysis.model import CPU_METRIC, DEVICE_METRIC, TOTAL, RunProfile
from .._readback.profiles import load_profile
from .._analysis.verdict import short_names
from .._delivery.mlflow_io import RunLogger
from .._record.model import Delivery, RunRef
from .._record.record import write_table

BEGIN, END = "<!-- mlflow-neuron:perf -->", "<!-- /mlflow-neuron:perf -->"
MAX_DESCRIPTION_CHARS = 5000  # Postgres/MySQL registry backends
NOTE_TAG = "mlflow.note.content"  # a run's description in the UI
BASELINE_TAGS = ("perf.verdict", "perf.baseline_run_id", "perf.ratio_vs_baseline")
COMPARISON_DIR, COMPARISON_TABLE = "comparison", "ops.json"
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)


def attach_comparison(tracking_uri: str, run_id: str, frame: pd.DataFrame, files: list[Path]) -> None:
    """Logs the comparison table (shown as a table in the UI) and its rendered files under
    `comparison/`, replacing an earlier comparison there, and puts the verdicts in words into
    the run's description (its page shows them)."""
    with tempfile.TemporaryDirectory() as tmp:
        write_table(flat(frame), Path(tmp, COMPARISON_TABLE))
        for path in files:
            shutil.copyfile(path, Path(tmp, Path(path).name))
        delivery = Delivery(step=0, timestamp_ms=0, artifact_dir=COMPARISON_DIR, files_dir=tmp,
                            table=f"{COMPARISON_DIR}/{COMPARISON_TABLE}")
        RunLogger(RunRef(tracking_uri, run_id)).deliver(delivery)
    describe_run(tracking_uri, run_id, frame)


def attach_files(tracking_uri: str, run_id: str, files: list[Path], folder: str) -> None:
    """Logs `files` under `folder/` of the run, replacing what an earlier call put there."""
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            shutil.copyfile(path, Path(tmp, Path(path).name))
        RunLogger(RunRef(tracking_uri, run_id)).deliver(Delivery(step=0, timestamp_ms=0, artifact_dir=folder,
                                                                 files_dir=tmp))  # fmt: skip


def annotate_model_version(
    name: str,
    version: str | int,
    run_id: str,
    *,
    step: int | None = None,
    top: int = 5,
    tracking_uri: str | None = None,
    baseline_run_id: str | None = None,
    skip_steps: int = 0,
) -> dict[str, str]:
    """Tags model version `name`/`version` with the profile of `run_id`; returns the tags set.

    Numbers are medians per profiled step. With `baseline_run_id`, the version also gets
    `perf.verdict` (faster, slower, no change, too few samples) and the verdict in words.

    Example::

        annotate_model_version("rmsnorm", 3, run_id)   # perf.* tags + a table in the description
        annotate_model_version("rmsnorm", 4, run_id, baseline_run_id=naive_run_id)
    """
    client = MlflowClient(tracking_uri)
    version = str(version)
    current = client.get_model_version(name, version)
    profiles = _profiles(client, run_id, step, baseline_run_id)
    profile = profiles[-1]
    frame = compare(profiles, baseline=profiles[0].label, skip_steps=skip_steps)
    ops = top_ops(frame, profile.label)
    tags = _version_tags(frame, profile, run_id, baseline_run_id, ops)
    metric = frame.attrs["metric"]
    other = f"perf.total_{CPU_METRIC if metric == DEVICE_METRIC else DEVICE_METRIC}"
    for stale in [other, *(BASELINE_TAGS if not baseline_run_id else [])]:
        if stale in current.tags:
            client.delete_model_version_tag(name, version, stale)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    block = _block(frame, profile.label, run_id, profile.step, ops[:top])
    description = with_block(current.description or "", block)
    if description != (current.description or ""):
        client.update_model_version(name, version, description=description)
    return tags


def _profiles(client: MlflowClient, run_id: str, step: int | None, baseline_run_id: str | None) -> list[RunProfile]:
    """[the run's profile], or [the baseline's, the run's], labelled apart when their names match."""
    profile = load_profile(client, client.get_run(run_id), step=step)
    if not baseline_run_id:
        return [profile]
    base = load_profile(client, client.get_run(baseline_run_id))
    if base.label == profile.label:
        base = replace(base, label=f"{base.label}@{baseline_run_id[:7]}")
    return [base, profile]


def _version_tags(frame: pd.DataFrame, profile: RunProfile, run_id: str, baseline_run_id: str | None,
                  ops: list[str]) -> dict[str, str]:  # fmt: skip
    """The `perf.*` tags: the run's profile, and with a baseline its verdict and ratio."""
    label, metric = profile.label, frame.attrs["metric"]
    aten_calls = frame.attrs["aten_calls"][label]
    tags = {
        "perf.device": profile.device or "unknown",
        "perf.device_time": profile.device_time or "unknown",
        f"perf.total_{metric}": f"{frame.loc[TOTAL, (label, 'time_us')]:.3f}",
        "perf.top_op": ops[0] if ops else "",
        "perf.aten_calls": f"{aten_calls if aten_calls is not None else 0:g}",
        "perf.samples": str(frame.attrs["n"][label]),
        "perf.profile_run_id": run_id,
        "perf.profile_step": str(profile.step),
        "perf.torch_version": profile.extra.get("torch_version", ""),
    }
    if baseline_run_id:
        row = frame.loc[TOTAL, label]
        tags["perf.verdict"] = str(row["verdict"])
        tags["perf.baseline_run_id"] = baseline_run_id
        tags["perf.ratio_vs_baseline"] = f"{row['ratio']:.4f}"
    return tags


def describe_run(tracking_uri: str, run_id: str, frame: pd.DataFrame) -> None:
    """Puts the comparison's verdicts into a run's description (the `mlflow.note.content` tag),
    between markers, leaving the rest of the description alone."""
    client = MlflowClient(tracking_uri)
    current = client.get_run(run_id).data.tags.get(NOTE_TAG, "")
    sentences = [f"- {s}" for s in frame.attrs.get("sentences", {}).values()]
    block = "\n".join([BEGIN, f"**Comparison** against `{frame.attrs['baseline']}` ({frame.attrs['metric']}, "
                        "medians per step, 95% intervals)", "", *sentences, END])  # fmt: skip
    description = with_block(current, block)
    if description != current:
        client.set_tag(run_id, NOTE_TAG, description)


def top_ops(frame: pd.DataFrame, label: str) -> list[str]:
    """The run's real ops (wrapper ranges left out), by median time per step, costliest first."""
    wrappers = set(frame.attrs.get("wrappers", []))
    times = frame[(label, "time_us")].drop(index=TOTAL).dropna()
    times = times[[op not in wrappers for op in times.index]]
    return list(times.sort_values(ascending=False, kind="stable").index)


def with_block(description: str, block: str) -> str:
    """`description` with its mlflow-neuron block replaced (or appended), within the size limit."""
    user_text = _BLOCK.sub("", description).rstrip()
    room = MAX_DESCRIPTION_CHARS - len(user_text) - 2
    if room < len(BEGIN) + len(END) + 2:
        return user_text[:MAX_DESCRIPTION_CHARS]  # the user's own text fills the limit: no room
    lines = block.splitlines()
    while len("\n".join(lines)) > room and len(lines) > 6:  # markers, title, blank, header, rule
        lines.pop(-2)  # drop table rows (or verdict lines) from the bottom
    block = "\n".join(lines)
    if len(block) > room:
        return user_text
    return f"{user_text}\n\n{block}" if user_text else block


def _block(frame: pd.DataFrame, label: str, run_id: str, step: int, ops: list[str]) -> str:
    metric = frame.attrs["metric"]
    rows = [f"| `{shown}` | {frame.loc[op, (label, 'time_us')]:,.3f} | {frame.loc[op, (label, 'calls')]:g} |"
            for op, shown in zip(ops, short_names(ops))]  # fmt: skip
    verdict = frame.attrs.get("sentences", {}).get(label)
    return "\n".join(
        [BEGIN, f"**Profile** (run `{label}` / `{run_id}`, step {step}, {frame.attrs['n'][label]} profiled steps): "
         f"top ops by median {metric} per step", *([verdict] if verdict else []), "",
         f"| op | median {metric} per step | calls per step |", "|---|---:|---:|", *rows, END]
    )  # fmt: skip
