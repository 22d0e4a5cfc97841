"""The fast path (`_kineto` + `_aggregate`) against torch's own parse: the same cycle read both ways must give the same
CycleProfile, row for row.

Layers: random cycles through torch's genuine FunctionEvent/EventList code; real torch.profiler
cycles on CPU (in process); fake PrivateUse1 kernels and runtime events (one subprocess per mode);
chrome traces (Kineto JSON and the Python exporter) of each of those cycles; the fallbacks.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent, _rewrite_name
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from workloads import inputs, rms_norm_naive

from mlflow_neuron._trace.profile import MISSING, PRESENT, CycleProfile
from mlflow_neuron._trace.function_events import extract_cycle
from mlflow_neuron._trace.aggregate import aggregate
from mlflow_neuron._trace.chrome import raw_events_from_chrome_trace
from mlflow_neuron._trace.kineto import raw_events_from_kineto
from mlflow_neuron._trace.events import DEVICE_KERNEL, DEVICE_OTHER, HOST, RawEvents

TESTS = Path(__file__).parent
pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")  # repeating schedules
REL = 1e-6
ABS_US = 1e-6  # a self time that cancels to zero may come out as +-1e-13
# torch adds children with the builtin sum(), which Python 3.12 made compensated (Neumaier); the
# fast path adds left to right like 3.10/3.11. Bit-equality (and so the order of rows whose keys
# tie) is checked where both add the same way.
SAME_SUMS = sys.version_info < (3, 12)


def assert_same_profile(got: CycleProfile, want: CycleProfile, *, exact_order: bool = SAME_SUMS) -> None:
    """Every field and every op row of `got` matches `want` (floats to 1e-6 relative)."""
    scalars = ("device", "device_time", "aten_calls", "active_steps", "event_count", "annotations")
    assert {f: getattr(got, f) for f in scalars} == {f: getattr(want, f) for f in scalars}
    # per-step samples are whole nanoseconds: equal, not approximately
    assert got.steps == want.steps and got.step_totals == want.step_totals
    for total in ("total_self_device_time_us", "total_self_cpu_time_us", "attributed_device_time_us"):
        assert getattr(got, total) == pytest.approx(getattr(want, total), rel=REL, abs=ABS_US), total
    rows = {(op.name, op.kind): op for op in got.ops}
    assert len(rows) == len(got.ops) == len(want.ops)
    if exact_order:
        assert [(op.name, op.kind) for op in got.ops] == [(op.name, op.kind) for op in want.ops]
    for expected in want.ops:
        actual = rows[(expected.name, expected.kind)]
        assert actual.calls == expected.calls, expected.name
        for field in ("self_device_time_us", "device_time_us", "self_cpu_time_us", "cpu_time_us"):
            assert getattr(actual, field) == pytest.approx(getattr(expected, field), rel=REL, abs=ABS_US), (
                expected.name, expected.kind, field,
            )  # fmt: skip


# -- random cycles through torch's own tree code -----------------------------------------------------

_DEVICE_TYPES = {HOST: DeviceType.CPU, DEVICE_KERNEL: DeviceType.PrivateUse1, DEVICE_OTHER: DeviceType.MTIA}


def torch_profile_of(raw: RawEvents, *, device: str, device_profiled: bool) -> CycleProfile:
    """What torch makes of `raw`: `_parse_kineto_results`' event creation and linking (restated here
    from torch 2.13, the only part that needs a `_ProfilerResult`), then torch's genuine
    `EventList._build_tree` and the package's `extract_cycle`."""
    events, frontend, linked_to = [], [], {}
    for i in range(len(raw)):
        device_type = _DEVICE_TYPES[int(raw.device_class[i])]
        fe = FunctionEvent(
            id=int(raw.correlation_id[i]),
            name=_rewrite_name(raw.names[raw.name_id[i]], with_wildcard=True),
            trace_name=_rewrite_name(raw.names[raw.name_id[i]], with_wildcard=False),
            linked_correlation_id=int(raw.linked_correlation_id[i]),
            thread=int(raw.thread[i]),
            start_us=int(raw.start_ns[i]) / 1000,
            end_us=int(raw.end_ns[i]) / 1000,
            use_device=raw.use_device,
            is_async=bool(raw.is_async[i]),
            device_type=device_type,
            is_user_annotation=bool(raw.is_user_annotation[i]),
            stack=[],
        )
        if device_type == DeviceType.CPU and not fe.is_async and raw.legacy_device_us[i] > 0:
            fe.append_kernel(fe.name, 0, float(raw.legacy_device_us[i]))
            fe.is_legacy = True
        events.append(fe)
        link = int(raw.linked_correlation_id[i])
        if link > 0:
            linked_to.setdefault(link, []).append(fe)
        else:
            frontend.append(fe)
    for fe in frontend:
        if fe.device_type == DeviceType.CPU and not fe.is_async and fe.id in linked_to:
            for other in linked_to[fe.id]:
                if other.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.XPU):
                    fe.append_kernel(other.name, 0, other.time_range.end - other.time_range.start)
                elif other.device_type == DeviceType.CPU:
                    other.thread = fe.thread
    events.sort(key=lambda e: [e.time_range.start, -e.time_range.end])
    tree = EventList(events, use_device=raw.use_device)
    tree._build_tree()
    return extract_cycle(tree, device=device, device_profiled=device_profiled)


def random_raw(rng: random.Random) -> RawEvents:
    """A small cycle full of what the rules care about: equal and zero-length spans, partial
    overlaps, same-name only children, async and legacy events, links to ops that do not exist,
    runtime events linked across threads, kernels of async ops, device annotations."""
    names = ["aten::add", "aten::mul", "outer", "ProfilerStep#1", "ProfilerStep#2", "rt"]
    rows = []
    for _ in range(rng.randint(1, 40)):
        kind = rng.choices([HOST, DEVICE_KERNEL, DEVICE_OTHER], [6, 3, 1])[0]
        start = rng.randint(0, 60) * rng.choice([1, 1000])
        if rows and rng.random() < 0.3:  # copy or nest inside an earlier span
            base = rng.choice(rows)
            start = rng.choice([base[1], base[1] + (base[2] - base[1]) // 3])
            end = rng.choice([base[2], start + (base[2] - start) // 2, start])
        else:
            end = start + rng.choice([0, rng.randint(1, 40), rng.randint(1, 40) * 1000])
        corr = rng.randint(1, 12)
        link = rng.choice([0, 0, 0, rng.randint(1, 14)]) if kind == HOST else rng.choice([0, rng.randint(1, 14)])
        rows.append((
            rng.randrange(len(names)), start, end, rng.randint(1, 3), kind, corr, link,
            kind == HOST and rng.random() < 0.1, kind != HOST and rng.random() < 0.3,
            float(rng.randint(1, 9)) if kind == HOST and rng.random() < 0.05 else 0.0,
        ))  # fmt: skip
    cols = list(zip(*rows))
    dtypes = [np.int64, np.int64, np.int64, np.int64, np.int8, np.int64, np.int64, bool, bool, np.float64]
    arrays = [np.array(c, dtype=t) for c, t in zip(cols, dtypes)]
    return RawEvents(tuple(names), *arrays, use_device=rng.choice(["neuron", None]))


def test_random_cycles_match_torch():
    rng = random.Random(20261129)
    merged = 0
    for case in range(300):
        raw = random_raw(rng)
        profiled = raw.use_device is not None
        want = torch_profile_of(raw, device="neuron", device_profiled=profiled)
        got = aggregate(raw, device="neuron", device_profiled=profiled)
        if SAME_SUMS:
            assert got == want, f"case {case}"  # dataclass equality: every float to the last bit
        else:
            assert_same_profile(got, want, exact_order=False)
        merged += want.event_count < len(raw)
    assert merged > 20  # the cases exercise _remove_dup_nodes


def test_partial_overlaps_nest_as_torchs_stack_does():
    # b starts inside a and ends after it: torch's stack drops a for good, so c, d and e (all inside
    # b, c and d also inside a) become b's children and a keeps all of its time as self time.
    starts, ends = [0, 50, 60, 90, 120], [100, 150, 70, 95, 130]
    raw = RawEvents(
        tuple("abcde"), np.arange(5), np.array(starts) * 1000, np.array(ends) * 1000,
        np.ones(5, np.int64), np.zeros(5, np.int8), np.arange(1, 6), np.zeros(5, np.int64),
        np.zeros(5, bool), np.zeros(5, bool), np.zeros(5), use_device=None,
    )  # fmt: skip
    got = aggregate(raw, device="cpu", device_profiled=False)
    assert_same_profile(got, torch_profile_of(raw, device="cpu", device_profiled=False))
    assert {op.name: op.self_cpu_time_us for op in got.ops} == {"a": 100, "b": 75, "c": 10, "d": 5, "e": 10}


def test_mismatched_columns_are_rejected():
    with pytest.raises(ValueError, match="start_ns has 2 rows, name_id has 1"):
        RawEvents(("a",), np.zeros(1), np.zeros(2), *[np.zeros(1)] * 8, use_device=None)


# -- real profiler cycles ----------------------------------------------------------------------------


def compare_cycle(prof, label: str, trace_dir: Path, *, device: str, events=None) -> CycleProfile:
    """The cycle through torch (`prof.events()`), the fast path, and both chrome exports."""
    profiled = device != "cpu"
    want = extract_cycle(prof.events() if events is None else events, device=device, device_profiled=profiled)
    raw = raw_events_from_kineto(prof)
    assert raw is not None, label
    assert_same_profile(aggregate(raw, device=device, device_profiled=profiled), want)
    kineto_json, python_json = trace_dir / f"{label}.json", trace_dir / f"{label}.py.json"
    prof.export_chrome_trace(str(kineto_json))
    prof.export_chrome_trace(str(python_json), use_python_export=True)
    for path, exact_order in ((kineto_json, SAME_SUMS), (python_json, False)):
        trace = raw_events_from_chrome_trace(json.loads(path.read_text()))
        got = aggregate(trace, device=device, device_profiled=profiled)
        assert_same_profile(got, want, exact_order=exact_order)
    return want


def run_shapes(activities, device: str, trace_dir: Path) -> dict[str, CycleProfile]:
    """Every shape of the brief, profiled with `activities`; returns torch's profile of each."""
    x, w = inputs()
    seen: dict[str, CycleProfile] = {}

    def check(prof, label, events=None):
        seen[label] = compare_cycle(prof, label, trace_dir, device=device, events=events)

    with profile(activities=activities) as prof:  # plain RMSNorm, nested user annotations
        rms_norm_naive(x, w)
        with record_function("outer"):
            with record_function("inner"):
                rms_norm_naive(x, w)
            with record_function("inner"), record_function("inner"):
                rms_norm_naive(x, w)
    check(prof, "annotations")

    def work():
        for _ in range(5):
            rms_norm_naive(x, w)

    with profile(activities=activities) as prof:  # several Python threads
        workers = [threading.Thread(target=work) for _ in range(3)]
        for t in workers:
            t.start()
        work()
        for t in workers:
            t.join()
    check(prof, "threads")

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8, 32)
    with profile(activities=activities) as prof:  # forward, backward (autograd engine), optimizer
        loss = model(data).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    check(prof, "backward")

    with profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
        y = rms_norm_naive(x, w)
        del y  # freed outside any op: a top-level [memory] row
        rms_norm_naive(x, w)
    check(prof, "memory")

    with profile(activities=activities, with_stack=True) as prof:  # python_function rows
        rms_norm_naive(x, w)
    check(prof, "stack")

    def on_cycle(p):  # ProfilerStep* rows, two cycles of a repeating schedule
        check(p, f"schedule_{p.step_num}")

    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=on_cycle) as prof:  # fmt: skip
        for step in range(8):
            for _ in range(1 + step % 2):
                rms_norm_naive(x, w)
            prof.step()

    accumulated = [0]

    def on_accumulating_cycle(p):  # acc_events: the new cycle is the head of prof.events()
        events = p.events()
        current = EventList(events[: len(events) - accumulated[0]], use_device=events._use_device)
        accumulated[0] = len(events)
        check(p, f"acc_{p.step_num}", events=current)

    with profile(activities=activities, acc_events=True, schedule=schedule(wait=1, warmup=1, active=1, repeat=2),
                 on_trace_ready=on_accumulating_cycle) as prof:  # fmt: skip
        for step in range(6):
            for _ in range(1 + step):
                rms_norm_naive(x, w)
            prof.step()
    return seen


def test_cpu_cycles_match_prof_events(tmp_path):
    seen = run_shapes([ProfilerActivity.CPU], "cpu", tmp_path)
    assert set(seen) == {"annotations", "threads", "backward", "memory", "stack", "schedule_4", "schedule_8",
                         "acc_3", "acc_6"}  # fmt: skip
    assert {op.name for op in seen["annotations"].ops} >= {"outer", "inner", "aten::mul"}
    assert any(op.name.startswith("autograd::engine") for op in seen["backward"].ops)
    assert any(op.name == "[memory]" for op in seen["memory"].ops)
    assert any(".py(" in op.name for op in seen["stack"].ops)
    assert seen["schedule_8"].active_steps == 2
    assert seen["acc_3"].event_count < seen["acc_6"].event_count


def test_tensorboard_trace_handler_files_read_like_the_cycle(tmp_path):
    x, w = inputs()
    handler = torch.profiler.tensorboard_trace_handler(str(tmp_path), worker_name="w")
    wanted = []

    def on_cycle(prof):
        wanted.append(extract_cycle(prof.events(), device="cpu", device_profiled=False))
        handler(prof)

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=on_cycle) as prof:  # fmt: skip
        for _ in range(2):
            with record_function("step"):
                rms_norm_naive(x, w)
            prof.step()
    [path] = tmp_path.glob("w.*.pt.trace.json")
    got = aggregate(raw_events_from_chrome_trace(json.loads(path.read_text())), device="cpu", device_profiled=False)
    assert_same_profile(got, wanted[0])
    assert got.active_steps == 1 and any(op.name == "ProfilerStep*" for op in got.ops)


FAKE_SCENARIO = """
import json, pathlib, sys
import fake_device
fake_device.activate(pathlib.Path(sys.argv[1]))
from torch.profiler import ProfilerActivity
import test_raw
seen = test_raw.run_shapes([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], "neuron", pathlib.Path(sys.argv[2]))
print(json.dumps({label: [p.device_time, p.total_self_device_time_us, p.attributed_device_time_us]
                  for label, p in seen.items()}))
"""


@pytest.mark.parametrize("mode", ["kernels", "runtime"])
def test_fake_device_cycles_match_prof_events(fake_profiler, tmp_path, mode):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        "FAKE_NEURON_MODE": mode,
        "FAKE_NEURON_KERNELS": "aten::mul=700,aten::rsqrt=100,aten::add=20,aten::div_=5,aten::addmm=30,aten::mm=9",
    }
    result = subprocess.run(
        [sys.executable, "-c", FAKE_SCENARIO, str(fake_profiler), str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(seen) == 9
    for label, (state, total, attributed) in seen.items():
        if mode == "kernels":
            # Not every kernel lands on an op row: torch merges aten::div_ into its only child
            # aten::div_ and keeps only the child's kernel (the device row still counts it).
            assert state == PRESENT and 0 < attributed < total, label
        else:
            assert state == MISSING and total == 0, label


# -- fallbacks and malformed input ---------------------------------------------------------------------


class _Bare:
    pass


def _cpu_profile(**kwargs):
    x, w = inputs()
    with profile(activities=[ProfilerActivity.CPU], **kwargs) as prof:
        rms_norm_naive(x, w)
    return prof


def test_missing_private_pieces_give_none():
    assert raw_events_from_kineto(_Bare()) is None  # no .profiler
    inner = _Bare()
    holder = _Bare()
    holder.profiler = inner
    assert raw_events_from_kineto(holder) is None  # no .kineto_results

    class Broken:
        def events(self):
            raise RuntimeError("gone")

        def trace_start_ns(self):
            return 0

    inner.kineto_results = Broken()
    assert raw_events_from_kineto(holder) is None

    class OldEvent:  # an event type without the accessors the reader uses
        def name(self):
            return "aten::add"

    class Old:
        def events(self):
            return [OldEvent()]

        def trace_start_ns(self):
            return 0

    inner.kineto_results = Old()
    assert raw_events_from_kineto(holder) is None


def test_trace_only_profiles_give_none_and_other_settings_are_read():
    config = torch._C._profiler._ExperimentalConfig(trace_only=True)
    assert raw_events_from_kineto(_cpu_profile(experimental_config=config)) is None
    prof = _cpu_profile(post_processing_timeout_s=30.0)  # not applied: the fast path reads it all
    want = extract_cycle(prof.events(), device="cpu", device_profiled=False)
    assert_same_profile(aggregate(raw_events_from_kineto(prof), device="cpu", device_profiled=False), want)
    x, w = inputs()
    with torch.autograd.profiler.profile() as legacy_api:  # the autograd profiler holds kineto_results itself
        rms_norm_naive(x, w)
    want = extract_cycle(legacy_api.function_events, device="cpu", device_profiled=False)
    assert_same_profile(aggregate(raw_events_from_kineto(legacy_api), device="cpu", device_profiled=False), want)


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ([], "expected a JSON object with a 'traceEvents' list"),
        ({"events": []}, "expected a JSON object with a 'traceEvents' list"),
        ({"traceEvents": {}}, "expected a JSON object with a 'traceEvents' list"),
        ({"traceEvents": ["x"]}, r"traceEvents\[0\] is str, not an object"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "dur": 1.0}]},
         r"traceEvents\[0\] \(cpu_op 'aten::add'\) has no numeric 'ts': None"),
        ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": "2"}]},
         r"traceEvents\[0\] \(kernel 'k'\) has no numeric 'dur': '2'"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1.0, "dur": -1.0}]},
         "has a negative 'dur'"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1.0, "dur": 1.0}]}, "has no string 'name'"),
        ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 1.0,
                           "args": {"External id": "7"}}]}, r"args\['External id'\] is not an integer"),
        ({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": "soon"}]}, "has no numeric 'ts'"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": -1.0, "dur": 1.0}]}, "has a negative 'ts'"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1.0, "dur": 10**30}]},
         r"has an impossibly large \(over 2\*\*52 us\) 'dur'"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1.0, "dur": 1.0, "tid": [1]}]},
         r"traceEvents\[0\] has a field of the wrong type"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1.0, "dur": 1.0,
                           "args": {"External id": 2**64}}]}, r"traceEvents\[0\] has a field of the wrong type"),
    ],
)  # fmt: skip
def test_malformed_chrome_traces_are_rejected_with_the_reason(trace, message):
    with pytest.raises(ValueError, match=message):
        raw_events_from_chrome_trace(trace)


def test_chrome_trace_ignores_unknown_categories_and_phases():
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "something_new", "name": "odd", "ts": 0.0},  # unknown: not even checked
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.5,
         "args": {"External id": 3}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 11.0, "dur": 2.25,
         "args": {"External id": 3, "correlation": 99}},
        {"ph": "s", "cat": "ac2g", "id": 3, "pid": 1, "tid": 1, "ts": 10.0},
    ]}  # fmt: skip
    profile_ = aggregate(raw_events_from_chrome_trace(trace), device="cuda", device_profiled=True)
    rows = {(op.name, op.kind): op for op in profile_.ops}
    assert set(rows) == {("aten::add", "op"), ("k", "kernel")}
    assert rows[("aten::add", "op")].self_device_time_us == pytest.approx(2.25)
    assert rows[("aten::add", "op")].self_cpu_time_us == pytest.approx(5.5)
    assert profile_.total_self_device_time_us == pytest.approx(2.25)
    assert profile_.aten_calls == 1
    empty = aggregate(raw_events_from_chrome_trace({"traceEvents": []}), device="cpu", device_profiled=False)
    assert empty.ops == () and empty.event_count == 0


def test_the_fast_path_imports_without_mlflow():
    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "import mlflow_neuron._trace.kineto, mlflow_neuron._trace.aggregate, mlflow_neuron._trace.chrome\n"
        "assert 'mlflow.tracking' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


SYMBOLS = [
    "aten::mul", "ProfilerStep#3", "i", "ab", "Dn", "St", "Ss", "_Z", "ü", "void foo<int>(int)", "_Z3fooi",
    "N3c104HalfE", "St6vectorIiSaIiEE",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
]


@pytest.mark.parametrize("name", SYMBOLS)
def test_names_are_demangled_as_torch_demangles_them_without_torch(name):
    """The helper process never loads libtorch; it must still name kernels as torch's parse does."""
    from mlflow_neuron._trace.names import demangle

    assert demangle(name) == torch._C._demangle(name) if len(name) > 1 else demangle(name) == name
