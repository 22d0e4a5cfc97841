"""Neuron Explorer's summary fields side by side, for the NEFFs the compared runs share (pure).

Example::

    found = summary_deltas({"naive": naive_metrics, "fused": fused_metrics})
    # [{"model": "n_42", "field": "mbu_estimated_percent", "values": {"naive": 18.4, "fused": 61.0}}, ...]

Each run's summaries are its `neuron/summary/<model>/<field>` metrics (the last cycle's), on the
0-100 scale they are logged on (`_neuron.summary`). A model (NEFF) that every run has is shown
field by field; when each run has exactly one NEFF (variants compile to different ones), those
are shown side by side as "each run's only NEFF". Only the fields that say how busy the device
was: MFU and MBU estimates, DMA and engine active time.
"""

from __future__ import annotations

from .._delivery.keys import NEURON_SUMMARY_PREFIX

ONLY_NEFF = "each run's only NEFF"
_FIELDS = ("mfu_estimated_percent", "mbu_estimated_percent")
_FIELD_ENDINGS = ("dma_active_time_percent", "engine_active_time_percent")


def summary_deltas(metrics: dict[str, dict[str, float]]) -> list[dict]:
    """Per shared model and field, each run's value (see the module docstring); [] when a run has none."""
    per_run = {label: _models(values) for label, values in metrics.items()}
    if len(per_run) < 2 or not all(per_run.values()):
        return []
    shared = set.intersection(*(set(models) - {""} for models in per_run.values()))
    chosen = {model: {label: models[model] for label, models in per_run.items()} for model in sorted(shared)}
    if not shared and all("" in models for models in per_run.values()):
        chosen = {ONLY_NEFF: {label: models[""] for label, models in per_run.items()}}
    found = []
    for model, fields_by_run in chosen.items():
        common = set.intersection(*(set(fields) for fields in fields_by_run.values()))
        for field in sorted(f for f in common if f in _FIELDS or f.endswith(_FIELD_ENDINGS)):
            found.append({"model": model, "field": field, "values": {r: v[field] for r, v in fields_by_run.items()}})
    return found


def summary_lines(found: list[dict]) -> list[str]:
    return [f"{row['model']} {row['field']}: " + ", ".join(f"{run} {value:,.1f}" for run, value in row["values"].items())
            for row in found]  # fmt: skip


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
