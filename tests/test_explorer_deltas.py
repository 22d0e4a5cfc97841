"""Neuron Explorer's summary side by side in `compare`, on the table of field names across Neuron
versions (pure: metrics and tags as a cycle logs them; stand-in values)."""

import pytest

from mlflow_neuron._analysis.explorer import ONLY_NEFF, summary_deltas, summary_lines, version_changes
from mlflow_neuron._trace.neuron_fields import DEVICE_COLLECTIVE_FIELDS, SUMMARY_ROWS, VERSION_TAG_PREFIX

from doubles.neuron_explorer import FUTURE, SCHEMA_7_4, SHAPE_2_34


def logged(fields, model="n_1"):
    """A summary as a cycle logs it: percent fields on 0-100 (the stand-ins hold fractions)."""
    return {f"neuron/summary/{model}/{k}": (v * 100 if k.endswith("_percent") else float(v)) for k, v in fields.items()}


def rows(found):
    return {row["row"]: row for row in found}


def test_shared_neffs_are_shown_row_by_row_and_other_models_are_not():
    naive = {**logged({"mbu_estimated_percent": 0.184, "mfu_estimated_percent": 0.005, "total_time": 0.2,
                       "tensor_engine_active_time_percent": 0.12}),
             **logged({"mbu_estimated_percent": 0.05}, "n_2")}  # fmt: skip
    fused = {**logged({"mbu_estimated_percent": 0.61, "mfu_estimated_percent": 0.015, "total_time": 0.1,
                       "tensor_engine_active_time_percent": 0.3}), "profiler/total/aten_calls": 3.0}  # fmt: skip
    found = summary_deltas({"naive": naive, "fused": fused})
    assert [(r["model"], r["row"]) for r in found] == [
        ("n_1", "mfu"), ("n_1", "hbu"), ("n_1", "total_time"), ("n_1", "tensor_engine_active_time_percent")]
    assert rows(found)["hbu"]["values"] == pytest.approx({"naive": 18.4, "fused": 61.0})
    assert summary_lines(found)[1] == "n_1 HBU (MBU before Neuron 2.34): naive 18.4, fused 61.0 [mbu_estimated_percent]"


def test_a_2_34_run_and_a_future_run_compare_mbu_hbm_and_dma_bytes_on_the_same_rows():
    older, newer = logged(SCHEMA_7_4), logged(FUTURE)  # schema 7.4 fields only; deprecated fields gone
    found = rows(summary_deltas({"older": older, "newer": newer}))
    assert found["hbu"]["fields"] == {"older": "mbu_estimated_percent", "newer": "hbm_mbu_estimated_percent"}
    assert found["hbu"]["values"] == pytest.approx({"older": 18.4, "newer": 17.6})  # stand-ins, apart on purpose
    # hbm_* and instruction_hbm_* hold the same values: the older run has no packet_* to compare with
    assert found["hbm_read"]["fields"] == {"older": "hbm_read_bytes", "newer": "instruction_hbm_read_bytes"}
    assert found["hbm_read"]["values"] == {"older": 4096.0, "newer": 4096.0}
    dma = "static_dma_size+software_dynamic_dma_size+hardware_dynamic_dma_size"
    assert found["dma_bytes"]["fields"] == {"older": dma, "newer": dma}
    assert found["dma_bytes"]["values"] == {"older": 1792.0, "newer": 1792.0}
    assert "dma_mbu" not in found  # a 2.34 field the older run does not have
    assert set(DEVICE_COLLECTIVE_FIELDS) <= set(found)
    assert not any(r["fields"].get("newer", "").startswith("dma_transfer") for r in found.values())


def test_two_2_34_runs_compare_the_more_accurate_packet_bytes_and_dma_mbu():
    found = rows(summary_deltas({"a": logged(SHAPE_2_34), "b": logged(FUTURE)}))
    assert found["hbm_write"]["fields"] == {"a": "packet_hbm_write_bytes", "b": "packet_hbm_write_bytes"}
    assert found["dma_mbu"]["values"] == pytest.approx({"a": 9.1, "b": 9.1})
    assert found["hbu"]["fields"] == {"a": "hbm_mbu_estimated_percent", "b": "hbm_mbu_estimated_percent"}
    assert found["hbu"]["values"] == pytest.approx({"a": 17.6, "b": 17.6})  # a's mbu (18.4) is not read


def test_one_neff_each_is_compared_and_a_run_without_summaries_shows_none():
    naive = {"neuron/summary/n_1/dma_active_time_percent": 40.0, "neuron/summary/dma_active_time_percent": 40.0}
    fused = {"neuron/summary/n_9/dma_active_time_percent": 20.0, "neuron/summary/dma_active_time_percent": 20.0}
    [row] = summary_deltas({"naive": naive, "fused": fused})
    assert (row["model"], row["row"], row["values"]) == (ONLY_NEFF, "dma_active", {"naive": 40.0, "fused": 20.0})
    assert summary_deltas({"naive": naive, "cpu": {}}) == []
    rank = {"neuron/summary/rank_1/n_1/mbu_estimated_percent": 3.0}  # another rank's: not this comparison's
    assert summary_deltas({"a": rank, "b": rank}) == []


def test_the_table_names_the_device_collective_fields_and_every_deprecated_field_has_a_newer_row():
    assert DEVICE_COLLECTIVE_FIELDS == ("cc_op_time", "cc_op_active_time", "cc_op_count")
    assert all(any(f in row.fields for row in SUMMARY_ROWS.values()) for f in DEVICE_COLLECTIVE_FIELDS)
    for old, new in (("mbu_estimated_percent", "hbm_mbu_estimated_percent"),
                     ("hbm_read_bytes", "instruction_hbm_read_bytes")):
        row = next(r for r in SUMMARY_ROWS.values() if old in r.fields)
        assert row.fields.index(new) < row.fields.index(old)


def test_differing_neuron_versions_are_named():
    a = {VERSION_TAG_PREFIX + "explorer_version": "x1", VERSION_TAG_PREFIX + "profile_schema_version": "12.0.1"}
    b = {VERSION_TAG_PREFIX + "explorer_version": "x2", VERSION_TAG_PREFIX + "profile_schema_version": "12.0.1"}
    assert version_changes({"a": a, "b": b}) == ["explorer_version differs: a x1, b x2"]
    assert version_changes({"a": a, "c": {}}) == ["profile_schema_version differs: a 12.0.1, c ?",
                                                  "explorer_version differs: a x1, c ?"]
    assert version_changes({"a": a, "a2": dict(a)}) == []


def test_docs_list_every_field_the_table_compares():
    from pathlib import Path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "neuron.md").read_text()
    names = {f for row in SUMMARY_ROWS.values() for f in row.fields}
    # The docs table writes read/write pairs as `packet_hbm_*_bytes`.
    missing = [f for f in names if f"`{f}`" not in docs and f"`{f.replace('read', '*').replace('write', '*')}`" not in docs]
    assert missing == []
