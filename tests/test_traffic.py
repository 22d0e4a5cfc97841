"""Bytes and FLOPs per op from recorded shapes (`_trace.traffic`), the peaks table, and the
roofline columns of ops.json: formulas op by op, with the arithmetic written out here."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from mlflow_neuron._trace.roofline import with_roofline
from mlflow_neuron._trace import peaks as _peaks
from mlflow_neuron._trace.chrome import read_chrome_cycle
from mlflow_neuron._trace.kineto import read_kineto_cycle
from mlflow_neuron._trace.summarize import CycleSettings, summarize
from mlflow_neuron._trace.traffic import FAMILIES, OpInputs, message_bytes, op_traffic

F, BF = "float", "c10::BFloat16"


@pytest.mark.parametrize(("name", "inputs", "expected"), [
    # elementwise, broadcasting: [8,1] + [1,4] -> [8,4]; reads 8 + 4 floats, writes 32
    ("aten::add", OpInputs([[8, 1], [1, 4], []], [F, F, "Scalar"]), (4 * (8 + 4 + 32), 32)),
    ("aten::mul", OpInputs([[2, 3, 4], [4]], [BF, BF]), (2 * (24 + 4 + 24), 24)),
    ("aten::mul", OpInputs([[2, 3], [3, 2]], [F, F]), None),  # does not broadcast: unknown
    ("aten::rsqrt", OpInputs([[16, 1]], [F]), (4 * (16 + 16), 16)),
    ("aten::pow", OpInputs([[4, 8], []], [F, "Scalar"]), (4 * (32 + 32), 32)),
    ("aten::add_", OpInputs([[4, 8], [8]], [F, F]), (4 * (32 + 8 + 32), 32)),  # in place: self read and written
    ("aten::eq", OpInputs([[4, 8], [4, 8]], [F, F]), (4 * 64 + 32, 32)),  # a bool output
    ("aten::copy_", OpInputs([[4, 8], [4, 8], []], [BF, F, "Scalar"]), (4 * 32 + 2 * 32, 0)),  # src read, dst written
    ("aten::clone", OpInputs([[10]], [F], ["", ""]), (80, 0)),
    # reductions: dims from the concrete inputs, keepdim kept as 1s
    ("aten::mean", OpInputs([[8, 64], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""]),
     (4 * (512 + 8), 512)),
    ("aten::sum", OpInputs([[8, 64], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[0]", "False", ""]),
     (4 * (512 + 64), 512)),
    ("aten::sum", OpInputs([[8, 64], [], [], [], [8, 1]], [F, "ScalarList", "Scalar", "Scalar", F],
                           ["", "[-1]", "True", "6", ""]), (4 * (512 + 8), 512)),  # out=: written, not read
    ("aten::sum", OpInputs([[8, 64], []], [F, ""], ["", ""]), (4 * (512 + 1), 512)),  # everything: a scalar
    ("aten::sum", OpInputs([[8, 64], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[]", "False", ""]),
     (4 * (512 + 1), 512)),
    ("aten::mean", OpInputs([[8, 64], [], [], []], [F, "ScalarList", "Scalar", ""]), None),  # dims not recorded
    # norms and softmax: the input's shape, FLOPs per element as written in the table
    ("aten::rms_norm", OpInputs([[4, 512], [], [512], []], [BF, "ScalarList", BF, "Scalar"]),
     (2 * (2048 + 512 + 2048), 4 * 2048)),
    ("aten::softmax", OpInputs([[4, 10], [], []], [F, "Scalar", ""]), (4 * 80, 5 * 40)),
    # matrix products
    ("aten::mm", OpInputs([[8, 64], [64, 32]], [F, F]), (4 * (512 + 2048 + 256), 2 * 8 * 64 * 32)),
    ("aten::bmm", OpInputs([[3, 8, 64], [3, 64, 32]], [BF, BF]), (2 * (1536 + 6144 + 768), 2 * 3 * 8 * 64 * 32)),
    ("aten::matmul", OpInputs([[2, 1, 8, 16], [3, 16, 4]], [F, F]), (4 * (256 + 192 + 192), 2 * 6 * 8 * 16 * 4)),
    ("aten::addmm", OpInputs([[32], [8, 64], [64, 32], [], []], [F, F, F, "Scalar", "Scalar"]),
     (4 * (32 + 512 + 2048 + 256), 2 * 8 * 64 * 32)),
    ("aten::linear", OpInputs([[2, 8, 64], [32, 64], [32]], [F, F, F]), (4 * (1024 + 2048 + 32 + 512), 2 * 16 * 64 * 32)),
    ("aten::mm", OpInputs([[8, 64], [32, 16]], [F, F]), None),  # inner sizes differ
    # never guessed
    ("aten::_fused_rms_norm", OpInputs([[4, 512], [], [512], []], [F, "ScalarList", F, "Scalar"]), None),  # no dims
    ("aten::to", OpInputs([[4]], [F]), None),  # may change the dtype
    ("aten::conv2d", OpInputs([[1, 3, 8, 8], [4, 3, 3, 3]], [F, F]), None),  # no stride or padding
    ("aten::cat", OpInputs([[[4, 64], [4, 64]], []], ["TensorList", "Scalar"], ["", "1"]), None),  # no dtypes
    ("aten::mul", OpInputs([[4], []], ["long int", "double"]), None),  # 2.5 (float32) or a 0-dim float64?
    ("aten::native_layer_norm_backward", OpInputs([[4, 8], [4, 8], [], [4, 1], [4, 1], [8], [8], []],
                                                  [F, F, "", F, F, F, F, ""]), None),  # output_mask not recorded
    ("aten::mul", OpInputs([[4]], ["c10::Float8_e8m0fnu"]), None),  # a dtype not known here
    ("rmsnorm", OpInputs([[4]], [F]), None),  # a range, not an ATen op
    ("aten::add", OpInputs([[], []], ["Scalar", "Scalar"]), None),  # no tensor
])  # fmt: skip
def test_formulas_op_by_op(name, inputs, expected):
    assert op_traffic(name, inputs) == expected


def test_every_family_names_aten_ops_without_overlap():
    seen = [op for family in FAMILIES.values() for op in family]
    assert len(seen) == len(set(seen)) and all(op and not op.startswith("aten::") for op in seen)


def test_both_readers_give_the_same_bytes_and_flops(tmp_path):
    """A real CPU profile with record_shapes: Kineto's in-process results and the chrome export agree,
    and aten::mm's numbers are the formula's for the shapes the test chose."""
    path, box = tmp_path / "cycle.json", {}

    def ready(prof):
        prof.export_chrome_trace(str(path))
        raw, inputs = read_kineto_cycle(prof)
        box["kineto"] = summarize(raw, CycleSettings("cpu", False, default_step=2), inputs).profile

    a, b = torch.randn(16, 32), torch.randn(32, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=ready) as prof:  # fmt: skip
        for _ in range(3):
            with record_function("block"):
                (a @ b).relu().sum(-1)
            prof.step()
    cycle = read_chrome_cycle(json.loads(path.read_text()))
    chrome = summarize(cycle.raw, CycleSettings("cpu", False, default_step=2), cycle.inputs).profile
    as_text = [tuple(map(str, row)) for row in chrome.traffic]
    assert as_text == [tuple(map(str, row)) for row in box["kineto"].traffic]
    mm = {name: (nbytes, flops) for name, nbytes, flops, *_ in chrome.traffic}["aten::mm"]
    assert mm == (2 * 4 * (16 * 32 + 32 * 8 + 16 * 8), 2 * 2 * 16 * 32 * 8)  # two steps
    assert [r.bytes for r in chrome.regions] == [4 * (16 * 32 + 32 * 8 + 16 * 8) + 4 * 2 * 128 + 4 * (128 + 16)] * 2


def test_a_cycles_repeated_calls_each_get_their_own_arguments_bytes():
    """Calls repeat in a cycle (layer after layer, step after step), and `event_traffic` works out
    each distinct call once; every call still gets the bytes and FLOPs of its own recorded name,
    shapes, dtypes and scalar arguments, as `op_traffic` gives them call by call."""
    calls = [("aten::add", [[8, 1], [1, 4], []], [F, F, "Scalar"], ["", "", "1"]),
             ("aten::add", [[8, 1], [1, 4], []], [F, "double", "Scalar"], ["", "", "1"]),  # another dtype
             ("aten::mul", [[8, 1], [1, 4], []], [F, F, "Scalar"], ["", "", "1"]),  # another op
             ("aten::sum", [[4, 6], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[1]", "False", ""]),
             ("aten::sum", [[4, 6], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[0, 1]", "False", ""]),
             ("aten::sum", [[4, 6], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[0]", "False", ""]),
             ("aten::mm", [[16, 32], [32, 8]], [F, F], ["", ""]), ("aten::mm", [[16, 32], [32, 9]], [F, F], ["", ""]),
             ("aten::frobnicate", [[4]], [F], [""])]  # fmt: skip
    events, ts = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000}], 1
    for _ in range(3):
        for name, dims, types, concrete in calls:
            args = {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete}
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5, "args": args})
            ts += 10
    cycle = read_chrome_cycle({"traceEvents": events})
    profile = summarize(cycle.raw, CycleSettings("cpu", False, default_step=1), cycle.inputs).profile
    found = {name: (nbytes, flops) for name, nbytes, flops, *_ in profile.traffic if name.startswith("aten::")}
    expected = {}
    for name, dims, types, concrete in calls:
        cost = op_traffic(name, OpInputs(dims, types, concrete))
        was = expected.get(name, (0, 0))
        expected[name] = (math.nan,) * 2 if cost is None or math.isnan(was[0]) else (was[0] + 3.0 * cost[0], was[1] + 3.0 * cost[1])
    assert len({op_traffic(n, OpInputs(d, t, c)) for n, d, t, c in calls if n == "aten::sum"}) == 3  # all differ
    assert str(found) == str(expected)  # str: NaN, for an op without a formula, equals itself


def test_each_peak_names_its_source_and_devices_are_found_by_name():
    for peak in _peaks.PEAKS:
        assert peak.source and peak.memory_bytes_per_s > 0 and peak.flops_per_s.get("bf16", 0) > 0, peak.name
        assert peak.matches, peak.name
    trn2 = _peaks.find_peak("trn2.48xlarge")
    assert trn2.name.startswith("Trainium2") and trn2.memory_bytes_per_s == pytest.approx(2.9e12 / 8)
    assert trn2.flops_per_s["bf16"] == pytest.approx(667e12 / 8)
    assert trn2.per_logical_core(2).flops_per_s["bf16"] == pytest.approx(667e12 / 4)
    assert _peaks.find_peak("trn1n.32xlarge").name.startswith("Trainium NeuronCore")
    assert _peaks.find_peak("inf2.xlarge").name.startswith("Inferentia2")
    assert _peaks.find_peak("NVIDIA H100 80GB HBM3").name == "NVIDIA H100 SXM"
    assert _peaks.find_peak("NVIDIA A100-SXM4-40GB").name == "NVIDIA A100 40GB"
    assert _peaks.find_peak("AMD Instinct MI300X").name == "AMD Instinct MI300X"
    assert _peaks.find_peak("Tesla T4") is None and _peaks.find_peak("m7i.large") is None and _peaks.find_peak("") is None


def test_a_users_peak_file_and_its_errors(tmp_path):
    good = tmp_path / "peak.json"
    good.write_text(json.dumps({"name": "box", "memory_gbps": 100, "bf16_tflops": 10, "source": "spec sheet"}))
    peak = _peaks.load_peak(good)
    assert (peak.name, peak.memory_bytes_per_s, peak.flops_per_s, peak.source) == ("box", 1e11, {"bf16": 1e13}, "spec sheet")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "box"}))
    with pytest.raises(ValueError, match="memory_gbps > 0"):
        _peaks.load_peak(bad)
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        _peaks.load_peak(tmp_path / "missing.json")


def test_roofline_columns_against_a_known_peak():
    import pandas as pd

    from mlflow_neuron._trace.profile import CycleProfile, OpStats

    ops = (OpStats("aten::mm", "op", 1, 0.0, 10.0, 0.0, 10.0), OpStats("aten::add", "op", 1, 0.0, 10.0, 0.0, 10.0),
           OpStats("aten::weird", "op", 1, 0.0, 10.0, 0.0, 10.0),
           OpStats("record_param_comms", "op", 1, 0.0, 10.0, 0.0, 10.0))  # fmt: skip
    nan = math.nan
    profile = CycleProfile("neuron", "present", ops, 40.0, 40.0, 40.0, 3, 1, 4,
                           traffic=(("aten::mm", 1e6, 1e9, "c10::BFloat16", nan),
                                    ("aten::add", 1e6, 1e5, "c10::BFloat16", nan), ("aten::weird", nan, nan, "", nan),
                                    ("record_param_comms", nan, nan, "", 4e6)))  # fmt: skip
    peak = {"memory_bytes_per_s": 1e12, "flops_per_s": {"bf16": 1e14}}  # ridge: 100 FLOPs per byte
    frame = with_roofline(profile.to_frame(), profile, peak, "region").set_index("name")
    assert frame.loc["aten::mm", "achieved_gbps"] == pytest.approx(100.0)  # 1 MB in 10 us
    assert frame.loc["aten::mm", "pct_of_peak_bandwidth"] == pytest.approx(10.0)
    assert frame.loc["aten::mm", "achieved_gflops"] == pytest.approx(1e5)
    assert frame.loc["aten::mm", "pct_of_peak_flops"] == pytest.approx(100.0)
    assert frame.loc["aten::mm", "bound"] == "compute" and frame.loc["aten::add", "bound"] == "memory"
    assert pd.isna(frame.loc["aten::weird", "bytes"]) and pd.isna(frame.loc["aten::weird", "achieved_gbps"])
    assert pd.isna(frame.loc["aten::weird", "bound"])
    assert frame["pct_device_time_without_bytes"].isna().all()  # no coverage: recorded by another reader
    # a collective's message size is link traffic: its own column, in no HBM rate
    assert frame.loc["record_param_comms", "comm_bytes"] == 4e6 and pd.isna(frame.loc["aten::mm", "comm_bytes"])
    assert pd.isna(frame.loc["record_param_comms", "bytes"]) and pd.isna(frame.loc["record_param_comms", "achieved_gbps"])


def test_ops_json_names_the_device_time_without_bytes():
    from mlflow_neuron._trace.profile import CycleProfile, OpStats
    from mlflow_neuron._trace.traffic import TrafficCoverage

    ops = (OpStats("aten::mm", "op", 1, 0.0, 10.0, 0.0, 75.0), OpStats("aten::_foreach_add_", "op", 1, 0.0, 10.0, 0.0, 25.0))
    profile = CycleProfile("cuda", "present", ops, 100.0, 20.0, 100.0, 2, 1, 2,
                           traffic=(("aten::mm", 1e6, 1e9, "float", math.nan), ("aten::_foreach_add_", math.nan, math.nan, "", math.nan)),
                           traffic_coverage=TrafficCoverage(75.0, 100.0, (("aten::_foreach_add_", 25.0),)))  # fmt: skip
    frame = with_roofline(profile.to_frame(), profile, None, "region").set_index("name")
    assert frame["pct_device_time_without_bytes"].to_dict() == {"aten::mm": 0.0, "aten::_foreach_add_": 25.0}


def test_the_callbacks_peaks_argument_reaches_ops_json(tracking_uri, tmp_path):
    """A user's peak given to the callback: ops.json's % of peak is bytes / time against it; a bad
    one is refused when the callback is created."""
    from mlflow.tracking import MlflowClient

    from mlflow_neuron import MLflowProfilerCallback

    with pytest.raises(ValueError, match="memory_gbps > 0"):
        MLflowProfilerCallback(peaks={"name": "no bandwidth"})
    callback = MLflowProfilerCallback(run_name="peaks", peaks={"name": "box", "memory_gbps": 10, "fp32_tflops": 1,
                                                               "source": "a test"}, flush_timeout_s=120)  # fmt: skip
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, on_trace_ready=callback,
                 schedule=schedule(wait=0, warmup=1, active=2)) as prof:  # fmt: skip
        for _ in range(3):
            a @ b
            prof.step()
    callback.close()
    client = MlflowClient(tracking_uri)
    run = client.search_runs(["0"])[0]
    path = client.download_artifacts(run.info.run_id, "profiler/step_3/ops.json", str(tmp_path))
    table = json.loads(open(path).read())
    mm = dict(zip(table["columns"], next(r for r in table["data"] if r[0] == "aten::mm")))
    assert mm["bytes"] == 2 * 3 * 64 * 64 * 4  # two calls, two inputs and one output, 64x64 floats
    assert mm["pct_of_peak_bandwidth"] == pytest.approx(mm["achieved_gbps"] / 10 * 100, rel=1e-2)
    assert mm["pct_of_peak_flops"] == pytest.approx(mm["achieved_gflops"] / 1000 * 100, rel=1e-2)
    assert mm["bound"] in ("memory", "compute")


FLOAT_4x4096 = 4 * 4096


@pytest.mark.parametrize(("name", "inputs", "expected"), [
    # x.mul(2.0): the Python float is a 0-dim double, passed by value: never read, never widens the output
    ("aten::mul", OpInputs([[4, 4096], []], [F, "double"]), (2 * 4 * FLOAT_4x4096, FLOAT_4x4096)),  # 131,072
    ("aten::mul", OpInputs([[4, 4096], []], [BF, "double"]), (2 * 2 * FLOAT_4x4096, FLOAT_4x4096)),  # 65,536
    ("aten::add", OpInputs([[4, 8], [], []], [F, "long int", "Scalar"], ["", "", "1"]), (2 * 4 * 32, 32)),  # x + 1
    # a real 0-dim tensor is read, and does not widen a dimensioned tensor of its category...
    ("aten::add", OpInputs([[4, 8], [], []], [BF, F, "Scalar"]), (2 * 32 + 4 + 2 * 32, 32)),
    # ...unless its category is higher: long [4] + 0-dim float -> float
    ("aten::add", OpInputs([[4], [], []], ["long int", F, "Scalar"]), (8 * 4 + 4 + 4 * 4, 4)),
    ("aten::add", OpInputs([[4], [4], []], ["c10::Half", BF, "Scalar"]), (2 * 4 + 2 * 4 + 4 * 4, 4)),  # -> float
    # out=: written, never read; its shape and dtype are the output's
    ("aten::mul", OpInputs([[4, 8], [4, 8], [4, 8]], [F, F, F]), (4 * 3 * 32, 32)),
    ("aten::sigmoid", OpInputs([[4, 8], [4, 8]], [F, F]), (4 * 2 * 32, 4 * 32)),
    ("aten::mm", OpInputs([[8, 64], [64, 32], [8, 32]], [F, F, F]), (4 * (512 + 2048 + 256), 2 * 8 * 64 * 32)),
    ("aten::mean", OpInputs([[5, 128], [], [], [], []], [F, "ScalarList", "Scalar", "", F], ["", "[]", "False", "", ""]),
     (4 * 640 + 4, 640)),  # a 0-dim out
])  # fmt: skip
def test_type_promotion_and_out_tensors(name, inputs, expected):
    assert op_traffic(name, inputs) == expected


@pytest.mark.parametrize(("name", "inputs", "expected"), [
    # older torch names int64 "long": a 0-dim one is a Python int, passed by value
    ("aten::add_", OpInputs([[], [], []], ["long", "long", "Scalar"]), (8 + 8, 1)),
    ("aten::div", OpInputs([[1024], []], [F, "long"]), (2 * 4 * 1024, 1024)),
    ("aten::copy_", OpInputs([[1024], [1024], []], ["long", F, "Scalar"]), (4 * 1024 + 8 * 1024, 0)),
    # ...and records a dim list as "": the dims, so the output, are unknown; the overload without
    # dims (two arguments) reduces everything
    ("aten::sum", OpInputs([[1024, 512], [], [], []], [F, "", "Scalar", ""]), None),
    ("aten::sum", OpInputs([[1024, 512], []], [F, ""]), (4 * (1024 * 512 + 1), 1024 * 512)),
    ("aten::sum", OpInputs([[0], []], ["int", ""]), (8, 0)),  # an int32 sum is int64
    # a layer norm's normalized shape is its weight's, when the list was not recorded
    ("aten::native_layer_norm", OpInputs([[1024, 512], [], [512], [512], []], [F, "", F, F, "Scalar"]),
     (4 * (2 * 1024 * 512 + 2 * 512) + 2 * 1024 * 4, 7 * 1024 * 512)),
    ("aten::native_layer_norm", OpInputs([[1024, 512], [], [], [], []], [F, "", "", "", "Scalar"]), None),
    # FLOPs as the kernels write them: g * (1 - y) * y, g * (1 - y * y)
    ("aten::sigmoid_backward", OpInputs([[4, 8], [4, 8]], [F, F]), (4 * 3 * 32, 3 * 32)),
    ("aten::tanh_backward", OpInputs([[4, 8], [4, 8]], [F, F]), (4 * 3 * 32, 3 * 32)),
])  # fmt: skip
def test_older_torchs_records_and_kernel_flops(name, inputs, expected):
    assert op_traffic(name, inputs) == expected


@pytest.mark.parametrize(("args", "expected"), [
    ({"In msg nelems": 1024, "Out msg nelems": 8192, "dtype": "BFloat16"}, 2 * 8192),  # an all-gather's output
    ({"In msg nelems": 4096, "Out msg nelems": 4096, "dtype": "Float"}, 4 * 4096),  # an all-reduce
    ({"In msg nelems": 4096, "Out msg nelems": 4096}, None),  # no dtype: unknown
    ({"In msg nelems": 4096, "Out msg nelems": 4096, "dtype": "Float4_e2m1fn_x2"}, None),  # a dtype not known here
])  # fmt: skip
def test_a_collectives_message_size_from_its_args(args, expected):
    assert message_bytes(args) == expected


X, XB = 8 * 16 * 32 * 32, 8 * 16 * 32 * 32 * 4  # the mi300 trace's [8, 16, 32, 32] float: elements, bytes
QKV = 141 * 8 * 64 * 2  # the H100 trace's [1, 141, 8, 64] bf16


@pytest.mark.parametrize(("name", "inputs", "expected"), [
    # norms: input (and weight, bias) read; output and the native op's statistics written
    ("aten::native_layer_norm", OpInputs([[8, 16, 32, 32], [], [16, 32, 32], [16, 32, 32], []],
                                         [F, "ScalarList", F, F, "Scalar"], ["", "[16, 32, 32]", "", "", "1e-05"]),
     (XB + 2 * 16384 * 4 + XB + 2 * 8 * 4, (5 + 2) * X)),
    ("aten::native_layer_norm_backward", OpInputs([[8, 16, 32, 32], [8, 16, 32, 32], [], [8, 1, 1, 1], [8, 1, 1, 1], [], [], []],
                                                  [F, F, "ScalarList", F, F, "", "", "ScalarList"],
                                                  ["", "", "[16, 32, 32]", "", "", "", "", "[True, False, False]"]),
     (2 * XB + 2 * 8 * 4 + XB, 9 * X)),  # no weight: only grad_input
    ("aten::_fused_rms_norm", OpInputs([[4, 512], [], [512], []], [BF, "ScalarList", BF, ""], ["", "[512]", "", ""]),
     (2 * (2048 + 512) + 2 * 2048 + 4 * 4, 4 * 2048)),  # rstd: 4 floats
    ("aten::_fused_rms_norm_backward", OpInputs([[4, 512], [4, 512], [], [4, 1], [512], []],
                                                [BF, BF, "ScalarList", F, BF, "ScalarList"],
                                                ["", "", "[512]", "", "", "[True, True]"]),
     (2 * 2 * 2048 + 16 + 2 * 512 + 2 * 2048 + 2 * 512, 6 * 2048 + 3 * 2048)),
    ("aten::native_batch_norm", OpInputs([[8, 16, 32, 32], [], [], [16], [16], [], [], []],
                                         [F, "", "", F, F, "Scalar", "Scalar", "Scalar"],
                                         ["", "", "", "", "", "True", "0.1", "1e-05"]),
     (XB + 2 * 64 + XB + 2 * 64 + 2 * 64, 5 * X)),  # running stats read and updated, save_mean/invstd
    ("aten::native_batch_norm", OpInputs([[8, 16, 32, 32], [], [], [16], [16], [], [], []],
                                         [F, "", "", F, F, "Scalar", "Scalar", "Scalar"],
                                         ["", "", "", "", "", "False", "0.1", "1e-05"]), (XB + 2 * 64 + XB, 2 * X)),
    ("aten::native_group_norm", OpInputs([[8, 16, 32, 32], [16], [16], [], [], [], [], []],
                                         [F, F, F, "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
                                         ["", "", "", "8", "16", "1024", "4", "1e-05"]),
     (XB + 2 * 64 + XB + 2 * 8 * 4 * 4, 5 * X)),  # weight and bias folded into a scale and shift
    # elementwise backward, losses, fills
    ("aten::threshold_backward", OpInputs([[5, 128], [5, 128], []], [F, F, "Scalar"], ["", "", "0"]), (3 * 2560, 640)),
    ("aten::mse_loss", OpInputs([[5, 128], [5, 128], []], [F, F, "Scalar"], ["", "", "1"]), (2 * 2560 + 4, 3 * 640)),
    ("aten::mse_loss_backward", OpInputs([[], [5, 128], [5, 128], []], [F, F, F, "Scalar"], ["", "", "", "1"]),
     (4 + 3 * 2560, 4 * 640)),
    ("aten::fill_", OpInputs([[5, 128], []], [F, "Scalar"], ["", "0"]), (2560, 0)),
    # embeddings: the indices and the rows they pick, not the table
    ("aten::embedding", OpInputs([[30522, 512], [1, 141], [], [], []], [BF, "long int", "Scalar", "Scalar", "Scalar"],
                                 ["", "", "0", "False", "False"]), (141 * 8 + 2 * 141 * 512 * 2, 0)),
    ("aten::index_select", OpInputs([[30522, 512], [], [141]], [BF, "Scalar", "long int"], ["", "0", ""]),
     (141 * 8 + 2 * 141 * 512 * 2, 0)),
    # attention: q, k, v read; out and logsumexp written; 2·L·S·(E + Ev) per head, halved when causal
    ("aten::_flash_attention_forward", OpInputs([[1, 141, 8, 64]] * 3 + [[]] * 12, [BF] * 3 + ["", ""] + ["Scalar"] * 6
                                                + [""] * 4, [""] * 5 + ["141", "141", "0.", "False", "False", "0.125"] + [""] * 4),
     (3 * QKV + QKV + 4 * 8 * 141, 2 * 8 * 141 * 141 * 128)),
    ("aten::_scaled_dot_product_flash_attention", OpInputs([[1, 2, 16, 8]] * 3 + [[]] * 4, [F] * 3 + ["Scalar"] * 4,
                                                           ["", "", "", "0.", "True", "False", ""]),
     (4 * 4 * 256 + 4 * 2 * 16, 2 * 2 * 16 * 16 * 16 // 2)),
    ("aten::_scaled_dot_product_flash_attention", OpInputs([[1, 2, 16, 8], [1, 2, 32, 8], [1, 2, 32, 8]] + [[]] * 4,
                                                           [F] * 3 + ["Scalar"] * 4, ["", "", "", "0.", "True", "False", ""]),
     None),  # causal with L != S: the mask's alignment differs between backends
    # convolution: 2 per multiply-add, bias excluded
    ("aten::conv2d", OpInputs([[1, 3, 8, 8], [4, 3, 3, 3], [4], [], [], [], []],
                              [F, F, F, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
                              ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]), (4 * (192 + 108 + 4 + 256), 2 * 64 * 4 * 27)),
    ("aten::convolution_backward", OpInputs([[1, 4, 8, 8], [1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], [], []],
                                            [F, F, F, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar",
                                             "ScalarList", "Scalar", "ScalarList"],
                                            ["", "", "", "[4]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1",
                                             "[True, True, True]"]),
     (4 * (256 + 192 + 108) + 4 * (192 + 108 + 4), 2 * 2 * 64 * 4 * 27 + 256)),
])  # fmt: skip
def test_the_ops_that_launch_the_kernels(name, inputs, expected):
    assert op_traffic(name, inputs) == expected


def test_flops_of_products_and_convolutions_equal_torchs_own(tmp_path):
    """torch's `with_flops=True` on a CPU profile, against the formulas read from the chrome export."""
    import torch.nn.functional as functional

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        torch.mm(torch.randn(8, 16), torch.randn(16, 4))
        torch.bmm(torch.randn(2, 8, 16), torch.randn(2, 16, 4))
        torch.addmm(torch.randn(4), torch.randn(8, 16), torch.randn(16, 4))
        functional.conv2d(torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3), torch.randn(6), stride=2, padding=1, groups=2)
        functional.conv2d(torch.randn(1, 3, 10, 12), torch.randn(5, 3, 3, 2), dilation=2)  # torch counts conv2d only
    torchs = {(e.name, json.dumps(e.input_shapes)): e.flops for e in prof.events() if e.flops}
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    ours = {}
    for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]:
        args = e.get("args") or {}
        key = (e.get("name"), json.dumps(args.get("Input Dims")))
        if e.get("cat") == "cpu_op" and key in torchs:
            ours[key] = op_traffic(e["name"], OpInputs(args["Input Dims"], args["Input type"], args["Concrete Inputs"]))[1]
    assert len(torchs) == 5 and ours == torchs
