"""Neuron Explorer's summary of a capture session, read into numbers per model (pure, no MLflow).

Two shapes, one result, `{model: {field: number}}`: the JSON that `neuron-explorer view
--output-format summary-json` prints (keyed by model, NEFF), and the rows of the `Summary` Parquet
table of a processed profile (`processed`). See docs/neuron.md for what each fact rests on.

Scale of `*_percent` fields: Explorer names them percent and `summary-json` reports fractions
(0.96 means 96%). They are logged on a 0-100 scale under their own name. The scale is read, per
model, from the fields that can tell: busy time as a share of the profile
(`*_active_time_percent`, `_trace.neuron_fields.SCALE_FIELD`), which no summary on a fraction
scale puts above 1. When one is above 1 the summary is in percent already; otherwise (and when
there is none) it holds fractions, as documented for `summary-json`. A ratio that may pass 1 as a
fraction (`mfu_max_achievable_estimated_percent`) never decides. No documented schema version
changes the scale. Negative values (the tool's "not available") are left out.
`MLFLOW_NEURON_PERCENT_SCALE=fraction|percent` pins the scale for a tool version you know.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

from .._trace.neuron_fields import SCALE_FIELD

PERCENT_SUFFIX = "_percent"
SCALE_ENV = "MLFLOW_NEURON_PERCENT_SCALE"
FRACTION, PERCENT, AUTO = "fraction", "percent", "auto"
FLAT = ""  # the model key of a summary that the tool printed without a model level


class SummaryError(RuntimeError):
    """The summary could not be produced or read; the message says why."""


def parse_summary_json(text: str) -> dict[str, dict[str, float]]:
    """`{model: {field: number}}` from the tool's output; log lines may precede the JSON.

    The document is keyed by model (`{"n_<id>": {...}, ...}`). A document whose values are
    numbers is one summary without a model level (key `FLAT`). Non-numeric fields are left out;
    no field is required, because the schema changes between tool versions.
    """
    document, error = None, None
    # A log line may itself hold a "{": try each one, from the first, until an object decodes.
    start = text.find("{")
    while start >= 0 and document is None:
        try:
            document, _ = json.JSONDecoder().raw_decode(text[start:])
        except json.JSONDecodeError as problem:
            error = error or problem
            start = text.find("{", start + 1)
    if document is None:
        raise SummaryError("the output holds no JSON object" + (f" ({error})" if error else ""))
    if not isinstance(document, dict):
        raise SummaryError(f"expected a JSON object, got {type(document).__name__}")
    models = {key: value for key, value in document.items() if isinstance(value, dict)}
    if not models:
        return {FLAT: _numbers(document)}
    return {str(key): _numbers(fields) for key, fields in models.items()}


def read_parquet_rows(paths: list[Path]) -> list[dict]:
    """The rows of one table, in file order (a large table is split as `X_0.parquet`, `X_1.parquet`).

    Needs pyarrow (`pip install "mlflow-neuron[parquet]"`). Columns the schema does not know yet
    are read like the others; a file that is not a readable table raises SummaryError.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise SummaryError(
            f"{paths[0] if paths else 'a Parquet table'} needs pyarrow to be read: pip install \"mlflow-neuron[parquet]\""
        ) from error
    rows: list[dict] = []
    for path in paths:
        try:
            rows.extend(pq.read_table(path).to_pylist())
        except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
            raise SummaryError(f"{path} is not a readable Parquet table: {type(error).__name__}: {error}") from error
    return rows


def numbers(fields: dict) -> dict[str, float]:
    """The numeric fields of a row or JSON object (text, flags and nested values left out)."""
    return _numbers(fields)


def run_summary_tool(tool: str, session_dir: str, timeout_s: float) -> dict[str, dict[str, float]]:
    """`<tool> view -d <session> --output-format summary-json`, parsed."""
    command = [tool, "view", "-d", session_dir, "--output-format", "summary-json"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SummaryError(f"{' '.join(command)} could not run: {error}") from error
    if result.returncode != 0:
        raise SummaryError(f"{' '.join(command)} exited {result.returncode}: {(result.stderr or result.stdout)[-500:]}")
    try:
        return parse_summary_json(result.stdout)
    except SummaryError as error:
        raise SummaryError(f"{' '.join(command)}: {error}") from error


def percent_scale(fields: dict[str, float], pinned: str | None = None) -> str:
    """FRACTION or PERCENT: how this summary reports its `*_percent` fields (see module doc)."""
    pinned = (pinned if pinned is not None else os.environ.get(SCALE_ENV, AUTO)).strip().lower() or AUTO
    if pinned not in (FRACTION, PERCENT, AUTO):
        raise ValueError(f"{SCALE_ENV} must be one of {FRACTION}, {PERCENT}, {AUTO}; got {pinned!r}")
    if pinned != AUTO:
        return pinned
    busy = [v for k, v in fields.items() if SCALE_FIELD.match(k) and v >= 0]
    return PERCENT if any(v > 1.0 for v in busy) else FRACTION


def on_percent_scale(fields: dict[str, float], pinned: str | None = None) -> dict[str, float]:
    """The summary with every `*_percent` field on 0-100 and unavailable (negative) ones left out."""
    factor = 100.0 if percent_scale(fields, pinned) == FRACTION else 1.0
    scaled = {}
    for key, value in fields.items():
        if not key.endswith(PERCENT_SUFFIX):
            scaled[key] = value
        elif value >= 0:
            scaled[key] = value * factor
    return scaled


def _numbers(fields: dict) -> dict[str, float]:
    return {
        str(key): float(value)
        for key, value in fields.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }
