"""Public Kineto traces recorded on real accelerators (tests/fixtures/README.md), read by ingest and
checked against an attribution written here, independently of the reader.

The independent attribution follows the launch: each device event goes, through its
`args["correlation"]`, to the runtime/driver call with the same correlation on a host thread, and
from there to the innermost `cpu_op` that encloses that call on the same (pid, tid). Its time is
summed per op name; a device event with no such launch, or a launch outside every `cpu_op`, is
unattributed. Nothing below uses External ids or the code under test.

Compared per fixture: every `cpu_op` name's self device time (to 1 µs), the total device time, the
unattributed device time, and the device tags. Ops named like a `user_annotation` are left out of
the per-op comparison: torch links a `record_function` range's `gpu_user_annotation` (and kernels
launched directly inside it) to the range, which a launch-to-`cpu_op` walk cannot see.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import read_json_artifact
from mlflow.tracking import MlflowClient

from mlflow_neuron._trace import device_names as _devices
from mlflow_neuron._trace.chrome_links import CORRELATION, EXTERNAL_ID
from mlflow_neuron._trace.chrome import read_chrome_trace
from mlflow_neuron._trace.profile import PRESENT
from mlflow_neuron._trace.aggregate import aggregate
from mlflow_neuron import MLflowNeuronWarning
from mlflow_neuron.cli import main as cli_main

REAL = Path(__file__).parent / "fixtures" / "real_traces"
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "mtia_ccp_events"})
TOLERANCE_US = 1.0

# fixture: (device tag, device_time tag, linking the reader should detect)
FIXTURES = {
    "hta_cuda_alexnet_2023.json.gz": ("cuda", PRESENT, CORRELATION),
    "hta_cuda_trace_diff_control_2022.json.gz": ("cuda", PRESENT, CORRELATION),
    "hta_rocm62_mi250_minitoy.json.gz": ("rocm", PRESENT, EXTERNAL_ID),
    "tracelens_rocm_mi300_normalization.json.gz": ("rocm", PRESENT, EXTERNAL_ID),
    "tracelens_cuda_h100_bert_small.json.gz": ("cuda", PRESENT, EXTERNAL_ID),
    "hta_mtia_rank_0.json.gz": ("mtia", PRESENT, CORRELATION),
    # Every launch here sits in a record_function range, inside no cpu_op: nothing is attributable,
    # and the check is that nothing is invented.
    "hta_mtia_inference_rank_0.json.gz": ("mtia", PRESENT, CORRELATION),
}
NOTHING_ATTRIBUTABLE = {"hta_mtia_inference_rank_0.json.gz"}
MODERN = [name for name, (_, _, linking) in FIXTURES.items() if linking == EXTERNAL_ID]


@lru_cache(maxsize=2)
def load(name: str) -> dict:
    with gzip.open(REAL / name, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def ns(value) -> int:
    return int(Decimal(str(value)) * 1000)  # ts/dur are µs with up to three decimals


def independent_attribution(trace: dict) -> tuple[dict[str, float], float, float]:
    """(device µs per cpu_op name, unattributed µs, total device µs), launch by launch."""
    complete = [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    launch = {}
    for e in complete:
        correlation = (e.get("args") or {}).get("correlation")
        if str(e.get("cat", "")).endswith(("_runtime", "_driver")) and correlation is not None:
            launch.setdefault(correlation, e)
    ops_by_thread = defaultdict(list)
    for index, e in enumerate(complete):
        if e.get("cat") == "cpu_op":
            start = ns(e["ts"])
            ops_by_thread[(e.get("pid"), e.get("tid"))].append((start, -(start + ns(e["dur"])), index, e["name"]))
    threads = {}
    for key, ops in ops_by_thread.items():
        ops.sort()  # by start, longest first; equal spans in trace order
        reach, furthest = [], None
        for _, neg_end, _, _ in ops:
            furthest = -neg_end if furthest is None else max(furthest, -neg_end)
            reach.append(furthest)
        threads[key] = ([op[0] for op in ops], ops, reach)

    def innermost(call: dict) -> str | None:
        starts, ops, reach = threads.get((call.get("pid"), call.get("tid")), ([], [], []))
        begin = ns(call["ts"])
        finish = begin + ns(call["dur"])
        j = bisect.bisect_right(starts, begin) - 1  # the last op starting at or before the call
        while j >= 0 and reach[j] >= finish:  # an earlier op may still reach past the call's end
            if -ops[j][1] >= finish:
                return ops[j][3]
            j -= 1
        return None

    per_op, unattributed, total = defaultdict(float), 0.0, 0.0
    for e in complete:
        if e.get("cat") not in DEVICE_CATEGORIES:
            continue
        duration = float(e["dur"])
        total += duration
        call = launch.get((e.get("args") or {}).get("correlation"))
        owner = innermost(call) if call is not None else None
        if owner is None:
            unattributed += duration
        else:
            per_op[owner] += duration
    return dict(per_op), unattributed, total


def compared_names(trace: dict) -> set[str]:
    names = {e["name"] for e in trace["traceEvents"] if isinstance(e, dict) and e.get("cat") == "cpu_op"}
    events = [e for e in trace["traceEvents"] if isinstance(e, dict)]
    annotations = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    return names - annotations


def ingested(trace: dict, **kwargs):
    device, profiled = _devices.device_of_trace(trace)
    raw, linking = read_chrome_trace(trace, **kwargs)
    return aggregate(raw, device=device, device_profiled=profiled), linking


def mismatches(per_op_got: dict, per_op_want: dict, names: set[str]) -> list[tuple[str, float, float]]:
    return sorted(
        (name, per_op_got.get(name, 0.0), per_op_want.get(name, 0.0))
        for name in names
        if abs(per_op_got.get(name, 0.0) - per_op_want.get(name, 0.0)) > TOLERANCE_US
    )


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_op_gets_the_device_time_its_launches_had(name, record_property):
    trace = load(name)
    device, device_time, linking_kind = FIXTURES[name]
    want, want_unattributed, want_total = independent_attribution(trace)
    profile, linking = ingested(trace)
    got = {op.name: op.self_device_time_us for op in profile.ops if op.kind == "op"}
    names = compared_names(trace)
    wrong = mismatches(got, want, names)
    with_time = sorted(n for n in names if got.get(n, 0.0) or want.get(n, 0.0))
    summary = (f"{name}: {len(with_time)} ops with device time compared ({len(names)} cpu_op names), "
               f"{len(wrong)} mismatches; unattributed {linking.unattributed_device_time_us:,.3f} us (ingest) vs "
               f"{want_unattributed:,.3f} us (independent) of {want_total:,.3f} us; "
               f"tags device={profile.device} device_time={profile.device_time}; linking {linking.dialect}")  # fmt: skip
    record_property("summary", summary)
    print(summary)
    assert not wrong, wrong[:10]
    assert bool(with_time) != (name in NOTHING_ATTRIBUTABLE), "which fixtures have per-op device time"
    assert profile.total_self_device_time_us == pytest.approx(want_total, abs=TOLERANCE_US)
    assert linking.device_time_us == pytest.approx(want_total, abs=TOLERANCE_US)
    assert linking.unattributed_device_time_us == pytest.approx(want_unattributed, abs=TOLERANCE_US)
    assert (profile.device, profile.device_time, linking.dialect) == (device, device_time, linking_kind)


@pytest.mark.parametrize("name", MODERN)
def test_modern_traces_link_the_same_through_the_runtime_as_by_external_id(name):
    trace = load(name)
    by_id, _ = ingested(trace)
    bridged, linking = ingested(trace, dialect=CORRELATION)
    assert linking.through_runtime > 0
    names = compared_names(trace)
    assert not mismatches(
        {op.name: op.self_device_time_us for op in bridged.ops if op.kind == "op"},
        {op.name: op.self_device_time_us for op in by_id.ops if op.kind == "op"},
        names,
    )


def test_an_op_that_launched_nothing_gets_no_device_time_from_a_coincidental_id():
    # Older Kineto: every activity's External id is its own correlation id. Here 7 is also the
    # External id of aten::empty, which launched nothing; the copy's launch sits inside aten::copy_.
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0.0, "dur": 2.0,
         "args": {"External id": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": 3.0, "dur": 10.0,
         "args": {"External id": 8}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": 4.0, "dur": 5.0,
         "args": {"External id": 7, "correlation": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 6.0, "dur": 40.0,
         "args": {"External id": 7, "correlation": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20.0, "dur": 1.0,
         "args": {"External id": 9, "correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 50.0, "dur": 3.0,
         "args": {"External id": 9, "correlation": 9}},
    ]}  # fmt: skip
    profile, linking = ingested(trace)
    rows = {op.name: op.self_device_time_us for op in profile.ops if op.kind == "op"}
    assert rows["aten::empty"] == 0.0 and rows["aten::copy_"] == pytest.approx(40.0)
    assert linking.dialect == CORRELATION and (linking.through_runtime, linking.unlinked) == (1, 1)
    assert linking.unattributed_device_time_us == pytest.approx(3.0)  # launched outside every op


def test_device_events_without_external_ids_link_through_their_launch():
    # MTIA-style: neither the runtime call nor the device event carries an External id.
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0,
         "args": {"External id": 3}},
        {"ph": "X", "cat": "mtia_runtime", "name": "runFunction", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0,
         "args": {"correlation": 3}},  # the same number as aten::mm's External id: no link by itself
        {"ph": "X", "cat": "mtia_ccp_events", "name": "fc", "pid": 9, "tid": 2, "ts": 5.0, "dur": 4.0,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 9, "tid": 3, "ts": 5.0, "dur": 1.0,
         "args": {}},
    ]}  # fmt: skip
    profile, linking = ingested(trace)
    rows = {(op.name, op.kind): op for op in profile.ops}
    assert rows[("aten::mm", "op")].self_device_time_us == pytest.approx(4.0)
    assert rows[("runFunction", "op")].self_device_time_us == 0.0  # a launch never takes kernels
    assert (profile.device, profile.device_time) == ("mtia", PRESENT)
    assert linking.unattributed_device_time_us == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("categories", "extra", "device"),
    [
        ({"cpu_op"}, {}, ("cpu", False)),
        ({"cpu_op", "cuda_runtime", "kernel"}, {}, ("cuda", True)),
        ({"cpu_op", "cuda_runtime", "kernel"}, {"roctracer_version": "4"}, ("rocm", True)),
        ({"cpu_op", "kernel"}, {"deviceProperties": [{"name": "AMD Instinct MI300X"}]}, ("rocm", True)),
        ({"cpu_op", "kernel"}, {"deviceProperties": [{"name": "NVIDIA H100"}]}, ("cuda", True)),
        ({"cpu_op", "xpu_runtime", "kernel"}, {}, ("xpu", True)),
        ({"cpu_op", "mtia_runtime", "mtia_ccp_events"}, {"deviceProperties": []}, ("mtia", True)),
        ({"cpu_op", "privateuse1_runtime", "kernel"}, {}, ("neuron", True)),
        ({"cpu_op", "kernel"}, {}, ("neuron", True)),
        ({"cpu_op", "privateuse1_runtime"}, {}, ("neuron", True)),  # profiled, no device time: "missing"
    ],
)  # fmt: skip
def test_device_tags_come_from_what_the_trace_holds(categories, extra, device):
    events = [{"ph": "X", "cat": c, "name": f"{c}-event", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}
              for c in sorted(categories)]  # fmt: skip
    assert _devices.device_of_trace({"traceEvents": events, **extra}) == device


def test_hip_calls_filed_as_cuda_runtime_read_as_rocm():
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 2, "tid": 0, "ts": 0.5, "dur": 1.0}]  # fmt: skip
    assert _devices.device_of_trace({"traceEvents": events}) == ("rocm", True)


def test_ingest_warns_once_when_device_time_stays_unattributed_and_records_it(tracking_uri, tmp_path, recwarn):
    weak, fine = REAL / "hta_mtia_inference_rank_0.json.gz", REAL / "hta_cuda_alexnet_2023.json.gz"
    assert cli_main(["ingest", str(fine), "--experiment", "fine"]) == 0
    assert not [w for w in recwarn if issubclass(w.category, MLflowNeuronWarning)]  # 924 of 67,681 us: 1.4%
    with pytest.warns(MLflowNeuronWarning) as caught:
        assert cli_main(["ingest", str(weak), "--experiment", "weak"]) == 0
    [warning] = [w for w in caught if issubclass(w.category, MLflowNeuronWarning)]
    assert "812,125 of 812,125 us of device time (100.0%) is attributed to no op" in str(warning.message)
    client = MlflowClient()
    for experiment, share, warned in (("fine", 924 / 67681, False), ("weak", 1.0, True)):
        [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        [step] = {k.split("/")[1] for k in _artifact_dirs(client, run.info.run_id)} - {"ranks"}
        manifest = read_json_artifact(client, run.info.run_id, f"profiler/{step}/manifest.json", tmp_path / experiment)
        assert manifest["attribution"]["unattributed_share"] == pytest.approx(share, abs=1e-6)
        assert ("warning" in manifest["attribution"]) == warned
        assert run.data.metrics["profiler/total/unattributed_device_time_us"] == pytest.approx(
            manifest["attribution"]["unattributed_device_time_us"], abs=TOLERANCE_US)


def _artifact_dirs(client, run_id):
    return [item.path for item in client.list_artifacts(run_id, "profiler") if item.is_dir]


def test_the_reader_is_pure():
    code = "import sys; sys.modules['mlflow'] = None\nimport mlflow_neuron._trace.chrome\n"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(("name", "at_least", "uncovered"), [
    ("tracelens_rocm_mi300_normalization.json.gz", 99.9, set()),
    ("tracelens_cuda_h100_bert_small.json.gz", 99.9, set()),
    # _foreach_add_ takes TensorLists, whose dtypes torch does not record: left empty, and named
    ("hta_rocm62_mi250_minitoy.json.gz", 90.0, {"aten::_foreach_add_"}),
    # collectives by their message size; left empty and named: fbgemm's embedding ops (their backward
    # records only the gradient, not the indices it scatters), cat of TensorLists (no dtypes)
    ("hta_cuda_trace_diff_control_2022.json.gz", 70.0,
     {"aten::cat", "torch::autograd::CppNode<SplitLookupFunction_rowwise_adagrad_Op>",
      "fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function"}),
])  # fmt: skip
def test_the_share_of_kernel_time_that_has_bytes(name, at_least, uncovered):
    """Each kernel's time on the innermost op that launched it; the share whose call has bytes."""
    from mlflow_neuron._trace.chrome import read_chrome_file
    from mlflow_neuron._trace.summarize import CycleSettings, summarize

    cycle = read_chrome_file(REAL / name)
    coverage = summarize(cycle.raw, CycleSettings(FIXTURES[name][0], True), cycle.inputs).profile.traffic_coverage
    assert coverage.percent >= at_least
    assert coverage.covered_us + sum(us for _, us in coverage.uncovered) == pytest.approx(coverage.total_us)
    assert uncovered <= {op for op, _ in coverage.uncovered}


def test_a_collective_gets_its_message_size_apart_from_its_bytes():
    """The 2022 trace's collectives carry no size themselves: the `nccl:*` range inside each records
    its tensor. Every one that launched a kernel gets a message size, and no HBM bytes."""
    import numpy as np

    from mlflow_neuron._trace.chrome import read_chrome_file
    from mlflow_neuron._trace.event_tree import event_tree
    from mlflow_neuron._trace.traffic import event_traffic

    cycle = read_chrome_file(REAL / "hta_cuda_trace_diff_control_2022.json.gz")
    tree = event_tree(cycle.raw)
    nbytes, _, _, message = event_traffic(cycle.raw, tree, cycle.inputs.op_inputs)
    comms = np.flatnonzero((np.array(tree.names)[tree.name] == "record_param_comms") & (tree.self_device_us > 0))
    assert len(comms) == 60 and np.isnan(nbytes[comms]).all() and np.isfinite(message[comms]).all()
    sizes = set(message[comms].tolist())
    assert {45310188 * 4, 8 * 1024 * 8816 * 4, 1024 * 4} <= sizes  # an all-reduce's floats, all-to-alls'
