"""Performance annotations on registered model versions.

Tags (`perf.*`, string values: registry tags are searchable with `=`/`LIKE`) and a short markdown
table in the description, between markers, so re-annotating replaces its own block and leaves
the user's text alone. Annotating twice gives the same version.
"""

from __future__ import annotations

import re

from mlflow.tracking import MlflowClient

from ._compare import CPU_METRIC, DEVICE_METRIC
from ._mlflow_runs import load_profile

BEGIN, END = "<!-- mlflow-neuron:perf -->", "<!-- /mlflow-neuron:perf -->"
MAX_DESCRIPTION_CHARS = 5000  # Postgres/MySQL registry backends
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)


def annotate_model_version(
    name: str,
    version: str | int,
    run_id: str,
    *,
    step: int | None = None,
    top: int = 5,
    tracking_uri: str | None = None,
) -> dict[str, str]:
    """Tags model version `name`/`version` with the profile of `run_id`; returns the tags set.

    Example::

        annotate_model_version("rmsnorm", 3, run_id)   # perf.* tags + a table in the description
    """
    client = MlflowClient(tracking_uri)
    version = str(version)
    current = client.get_model_version(name, version)
    profile = load_profile(client, client.get_run(run_id), step=step)
    metric = DEVICE_METRIC if profile.device_time == "present" else CPU_METRIC
    ops = profile.ops[profile.ops["kind"] == "op"].sort_values(metric, ascending=False)
    tags = {
        "perf.device": profile.device or "unknown",
        "perf.device_time": profile.device_time or "unknown",
        f"perf.total_{metric}": f"{profile.totals.get(metric, float('nan')):.3f}",
        "perf.top_op": str(ops["name"].iloc[0]) if len(ops) else "",
        "perf.aten_calls": str(int(profile.totals.get("aten_calls", 0))),
        "perf.profile_run_id": run_id,
        "perf.profile_step": str(profile.step),
        "perf.torch_version": profile.extra.get("torch_version", ""),
    }
    stale = f"perf.total_{CPU_METRIC if metric == DEVICE_METRIC else DEVICE_METRIC}"
    if stale in current.tags:
        client.delete_model_version_tag(name, version, stale)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    description = with_block(current.description or "", _block(profile.label, run_id, profile.step, metric, ops, top))
    if description != (current.description or ""):
        client.update_model_version(name, version, description=description)
    return tags


def with_block(description: str, block: str) -> str:
    """`description` with its mlflow-neuron block replaced (or appended), within the size limit."""
    user_text = _BLOCK.sub("", description).rstrip()
    room = MAX_DESCRIPTION_CHARS - len(user_text) - 2
    if room < len(BEGIN) + len(END) + 2:
        return user_text[:MAX_DESCRIPTION_CHARS]  # the user's own text fills the limit: no room
    lines = block.splitlines()
    while len("\n".join(lines)) > room and len(lines) > 6:  # markers, title, blank, header, rule
        lines.pop(-2)  # drop table rows from the bottom
    block = "\n".join(lines)
    if len(block) > room:
        return user_text
    return f"{user_text}\n\n{block}" if user_text else block


def _block(label: str, run_id: str, step: int, metric: str, ops, top: int) -> str:
    rows = [f"| `{name}` | {value:,.2f} | {int(calls)} |" for name, value, calls in
            zip(ops["name"][:top], ops[metric][:top], ops["calls"][:top])]
    return "\n".join(
        [BEGIN, f"**Profile** (run `{label}` / `{run_id}`, step {step}): top ops by {metric}", "",
         f"| op | {metric} | calls |", "|---|---:|---:|", *rows, END]
    )  # fmt: skip
