"""Neuron Explorer's summary side by side, for the NEFFs the compared runs share, and which Neuron
tools made each run's summary (pure).

Example::

    found = summary_deltas({"naive": naive_metrics, "fused": fused_metrics})
    # [{"model": "n_42", "row": "hbu", "label": "HBU (MBU before Neuron 2.34)", "unit": "percent",
    #   "fields": {"naive": "mbu_estimated_percent", "fused": "hbm_mbu_estimated_percent"},
    #   "values": {"naive": 18.4, "fused": 61.0}}, ...]

Each run's summaries are its `neuron/summary/<model>/<field>` metrics (the last cycle's), logged as
the tool wrote them, percent fields on 0-100 (`_neuron.summary`). What is compared, and under which
label, is the table of field names across Neuron versions (`_trace.neuron_fields`): a row takes
the best quantity that every run has (under each run's own name for it), else each run's best, so
runs made by different Explorer versions still compare on one row. A model (NEFF) that every run has is shown row by row; when
each run has exactly one NEFF (variants compile to different ones), those are shown side by side
as "each run's only NEFF".
"""

from __future__ import annotations

from .._record.keys import NEURON_SUMMARY_PREFIX
from .._trace.neuron_fields import BYTES, COUNT, METADATA_TAGS, SECONDS, VERSION_TAG_PREFIX, compared_rows

ONLY_NEFF = "each run's only NEFF"


def neuron_explanations(extras: dict[str, dict]) -> dict:
    """`compare`'s Neuron lines from each run's `RunProfile.extra`: `neuron_summary` (`summary_deltas`)
    and `neuron_versions` (`version_changes`)."""
    return {"neuron_summary": summary_deltas({run: e.get("neuron_summary") or {} for run, e in extras.items()}),
            "neuron_versions": version_changes({run: e.get("neuron_versions") or {} for run, e in extras.items()})}


def summary_deltas(metrics: dict[str, dict[str, float]]) -> list[dict]:
    """Per shared model and table row, each run's value (see the module docstring); [] when a run has none."""
    per_run = {label: _models(values) for label, values in metrics.items()}
    if len(per_run) < 2 or not all(per_run.values()):
        return []
    shared = set.intersection(*(set(models) - {""} for models in per_run.values()))
    chosen = {model: {label: models[model] for label, models in per_run.items()} for model in sorted(shared)}
    if not shared and all("" in models for models in per_run.values()):
        chosen = {ONLY_NEFF: {label: models[""] for label, models in per_run.items()}}
    found = []
    for model, fields_by_run in chosen.items():
        for key, row in compared_rows(list(fields_by_run.values())):
            common = row.common(list(fields_by_run.values()))
            picked = {run: row.pick(fields, common) for run, fields in fields_by_run.items()}
            if all(p is not None for p in picked.values()):
                found.append({"model": model, "row": key, "label": row.label, "unit": row.unit,
                              "fields": {run: p[0] for run, p in picked.items()},
                              "values": {run: p[1] for run, p in picked.items()}})  # fmt: skip
    return found


def summary_lines(found: list[dict]) -> list[str]:
    lines = []
    for row in found:
        fields = set(row["fields"].values())
        source = next(iter(fields)) if len(fields) == 1 else ", ".join(f"{r}: {f}" for r, f in row["fields"].items())
        values = ", ".join(f"{run} {_value(value, row['unit'])}" for run, value in row["values"].items())
        lines.append(f"{row['model']} {row['label']}: {values} [{source}]")
    return lines


def version_changes(tags: dict[str, dict[str, str]]) -> list[str]:
    """"explorer_version A → B" for each Neuron tool version (the version tags a cycle set from
    Explorer's Metadata) that differs between the compared runs; runs in the order given."""
    lines = []
    for name in METADATA_TAGS:
        values = {run: run_tags.get(VERSION_TAG_PREFIX + name) for run, run_tags in tags.items()}
        if len(set(values.values())) > 1:
            lines.append(f"{name} differs: " + ", ".join(f"{run} {value or '?'}" for run, value in values.items()))
    return lines


def _value(value: float, unit: str) -> str:
    if unit in (BYTES, COUNT):
        return f"{value:,.0f}"
    return f"{value:.6g} s" if unit == SECONDS else f"{value:,.1f}"


def _models(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """{model: {field: value}} from `neuron/summary/...` keys; model "" for the one-model keys."""
    models: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        parts = key[len(NEURON_SUMMARY_PREFIX) + 1:].split("/") if key.startswith(NEURON_SUMMARY_PREFIX + "/") else []
        if len(parts) == 2:
            models.setdefault(parts[0], {})[parts[1]] = value
        elif len(parts) == 1:
            models.setdefault("", {})[parts[0]] = value
    return models
