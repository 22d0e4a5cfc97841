"""Neuron Explorer's Summary and Metadata field names across Neuron versions, as data (pure).

Every summary field is logged to MLflow under the name the tool wrote. This table decides only
what `compare` sets side by side, the rows `docs/neuron.md` lists, and which fields the rank view
reads for device-side collectives. A row names its candidate fields newest first; two runs made by
different Explorer versions are compared on the same row::

    row = SUMMARY_ROWS["hbm_read"]
    row.pick({"hbm_read_bytes": 4096})                              # ("hbm_read_bytes", 4096)
    row.pick({"instruction_hbm_read_bytes": 4096, "packet_hbm_read_bytes": 4608})
                                                                    # ("packet_hbm_read_bytes", 4608)
    row.common([{"hbm_read_bytes": 1}, {"instruction_hbm_read_bytes": 1, "packet_hbm_read_bytes": 1}])
                                                                    # 1: both runs compare instruction bytes

Sources (docs/neuron.md): the Profile Parquet Schema Reference (schema 7.4.0, Neuron 2.31; 12.0.1,
Neuron 2.33) and the Neuron 2.34 notice that deprecates `mbu_estimated_percent`, `hbm_read_bytes`,
`hbm_write_bytes` and the four `dma_transfer_*` fields. Which 2.34 fields lie behind the UI's "HBU"
and "MBU" labels is unverified: the labels here follow the notice's wording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIRST, SUM = "first", "sum"  # a row's value: its first candidate present, or the sum of all of them
PERCENT, BYTES, SECONDS, COUNT = "percent", "bytes", "seconds", "count"


@dataclass(frozen=True)
class SummaryRow:
    """One thing `compare` shows, and the Summary fields it can come from.

    `quantities`, best first: each is one quantity under its names, newest first (fields that the
    documentation says hold the same value). FIRST: the row is the first quantity present; SUM:
    the sum of every quantity, known only when all are there."""

    label: str
    quantities: tuple[tuple[str, ...], ...]
    unit: str
    combine: str = FIRST

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(name for names in self.quantities for name in names)

    def pick(self, values: dict[str, float], quantity: int | None = None) -> tuple[str, float] | None:
        """(the field or fields used, the value) from one model's summary; None when the row is not
        there. `quantity`: that quantity and no other (runs compared on one they all have)."""
        found = [_named(values, names) for names in self.quantities]
        if self.combine == SUM:
            if any(f is None for f in found):
                return None
            return "+".join(f[0] for f in found), sum(f[1] for f in found)
        return next((f for f in (found if quantity is None else found[quantity:quantity + 1]) if f), None)

    def common(self, runs: list[dict[str, float]]) -> int | None:
        """The best quantity that every run has, or None."""
        return next((i for i, names in enumerate(self.quantities) if all(_named(r, names) for r in runs)), None)


def _named(values: dict[str, float], names: tuple[str, ...]) -> tuple[str, float] | None:
    return next(((n, values[n]) for n in names if n in values), None)


def _row(label: str, *quantities: tuple[str, ...] | str, unit: str, combine: str = FIRST) -> SummaryRow:
    return SummaryRow(label, tuple((q,) if isinstance(q, str) else q for q in quantities), unit, combine)


# Rows in the order `compare` prints them. Engine active times follow, one row per engine field.
SUMMARY_ROWS = {
    "mfu": _row("MFU", "mfu_estimated_percent", unit=PERCENT),
    # Explorer 2.34's UI calls this value HBU; before 2.34 its only field was `mbu_estimated_percent`.
    "hbu": _row("HBU (MBU before Neuron 2.34)", ("hbm_mbu_estimated_percent", "mbu_estimated_percent"), unit=PERCENT),
    "dma_mbu": _row("DMA bandwidth utilization", "dma_mbu_estimated_percent", unit=PERCENT),
    "dma_active": _row("DMA active time", "dma_active_time_percent", unit=PERCENT),
    # packet_* are more accurate; instruction_* hold the values of the deprecated hbm_*.
    "hbm_read": _row("HBM read bytes", "packet_hbm_read_bytes", ("instruction_hbm_read_bytes", "hbm_read_bytes"),
                     unit=BYTES),  # fmt: skip
    "hbm_write": _row("HBM write bytes", "packet_hbm_write_bytes", ("instruction_hbm_write_bytes", "hbm_write_bytes"),
                      unit=BYTES),  # fmt: skip
    "dma_bytes": _row("DMA bytes", "static_dma_size", "software_dynamic_dma_size", "hardware_dynamic_dma_size",
                      unit=BYTES, combine=SUM),  # fmt: skip
    "cc_op_time": _row("device collectives: time", "cc_op_time", unit=SECONDS),
    "cc_op_active_time": _row("device collectives: active time", "cc_op_active_time", unit=SECONDS),
    "cc_op_count": _row("device collectives: count", "cc_op_count", unit=COUNT),
    "total_time": _row("total time", "total_time", unit=SECONDS),
}
ENGINE_ACTIVE_SUFFIX = "_engine_active_time_percent"  # tensor_, scalar_, vector_, gpsimd_ ...: a row each

# Collectives as the device saw them, per rank (schema 7.4 Summary): for the rank view.
DEVICE_COLLECTIVE_FIELDS = ("cc_op_time", "cc_op_active_time", "cc_op_count")

# Deprecated in Neuron 2.34, still written, removed by a later release: logged, never compared.
DEPRECATED_2_34 = ("mbu_estimated_percent", "hbm_read_bytes", "hbm_write_bytes", "dma_transfer_average_bytes",
                   "dma_transfer_time", "dma_transfer_count", "dma_transfer_total_bytes")  # fmt: skip

# What says whether `*_percent` holds fractions or percentages: busy time as a share of the
# profile, which cannot exceed the whole. Ratios such as `mfu_max_achievable_estimated_percent`
# or `*_min_read_util_*` may pass 1 on a fraction scale, so they never decide.
SCALE_FIELD = re.compile(r".*_active_time_percent$")

# -- Metadata: which tools made a profile ------------------------------------------------------------

# Version tags: tag name -> the Metadata column read for it (feature-detected: a column that is
# not there leaves its tag out). Only `profile_schema_version` is documented (Schema Reference);
# the other column names are unverified.
METADATA_TAGS = {
    "profile_schema_version": "profile_schema_version",
    "explorer_version": "explorer_version",
    "compiler_version": "compiler_version",
    "runtime_version": "runtime_version",
    "driver_version": "driver_version",
    "instance_type": "instance_type",
}
DOCUMENTED_METADATA = ("profile_schema_version",)
VERSION_TAG_PREFIX = "mlflow_neuron.neuron."  # + a key of METADATA_TAGS

# Schema majors this reader was tested with (stand-ins of the documented shapes): 7 (7.4.0,
# Neuron 2.31) and 12 (12.0.1, Neuron 2.33). A major change removes or renames fields.
TESTED_SCHEMA_MAJORS = (7, 12)


def schema_major(version: str) -> int | None:
    """7 for "7.4.0"; None for text that does not start with a number."""
    match = re.match(r"\s*v?(\d+)", version or "")
    return int(match.group(1)) if match else None


def compared_rows(fields_by_run: list[dict[str, float]]) -> list[tuple[str, SummaryRow]]:
    """(key, row) for every table row, then an engine-active row for each engine field every run has."""
    rows = list(SUMMARY_ROWS.items())
    engines = set.intersection(*({f for f in fields if f.endswith(ENGINE_ACTIVE_SUFFIX)} for fields in fields_by_run))
    for field in sorted(engines):
        engine = field.removesuffix(ENGINE_ACTIVE_SUFFIX).replace("_", " ")
        rows.append((field, _row(f"{engine} engine active time", field, unit=PERCENT)))
    return rows
