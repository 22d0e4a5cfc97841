"""Neuron Explorer's summary fields side by side in `compare` (pure: metrics as the callback logs them)."""

from mlflow_neuron._compare.explorer import ONLY_NEFF, summary_deltas, summary_lines


def test_shared_neffs_are_shown_field_by_field():
    naive = {"neuron/summary/n_1/mbu_estimated_percent": 18.4, "neuron/summary/n_1/mfu_estimated_percent": 0.5,
             "neuron/summary/n_1/tensor_engine_active_time_percent": 12.0, "neuron/summary/n_1/total_time": 0.2,
             "neuron/summary/n_2/mbu_estimated_percent": 5.0}  # fmt: skip
    fused = {"neuron/summary/n_1/mbu_estimated_percent": 61.0, "neuron/summary/n_1/mfu_estimated_percent": 1.5,
             "neuron/summary/n_1/tensor_engine_active_time_percent": 30.0, "profiler/total/aten_calls": 3.0}  # fmt: skip
    found = summary_deltas({"naive": naive, "fused": fused})
    assert [(row["model"], row["field"]) for row in found] == [
        ("n_1", "mbu_estimated_percent"), ("n_1", "mfu_estimated_percent"), ("n_1", "tensor_engine_active_time_percent")]
    assert found[0]["values"] == {"naive": 18.4, "fused": 61.0}
    assert summary_lines(found)[0] == "n_1 mbu_estimated_percent: naive 18.4, fused 61.0"


def test_one_neff_each_is_compared_and_a_run_without_summaries_shows_none():
    naive = {"neuron/summary/n_1/dma_active_time_percent": 40.0, "neuron/summary/dma_active_time_percent": 40.0}
    fused = {"neuron/summary/n_9/dma_active_time_percent": 20.0, "neuron/summary/dma_active_time_percent": 20.0}
    found = summary_deltas({"naive": naive, "fused": fused})
    assert found == [{"model": ONLY_NEFF, "field": "dma_active_time_percent", "values": {"naive": 40.0, "fused": 20.0}}]
    assert summary_deltas({"naive": naive, "cpu": {}}) == []
    rank = {"neuron/summary/rank_1/n_1/mbu_estimated_percent": 3.0}  # another rank's: not this comparison's
    assert summary_deltas({"a": rank, "b": rank}) == []
