"""Issue 12: a cycle's timeline (`_timeline`), as an MLflow trace (`_mlflow_traces`) and as SVG.

Layers: real torch.profiler cycles on CPU compared with torch's own tree (`prof.events()`); fake
PrivateUse1 kernels in a subprocess; a 100k-op cycle against the cap; a real sqlite store,
written from this process and from another one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.profiler import ProfilerActivity, profile, schedule

from workloads import inputs, rms_norm_naive

from mlflow_neuron._record.model import cycle_dir
from mlflow_neuron._trace.chrome import raw_events_from_chrome_trace
from mlflow_neuron._trace.kineto import raw_events_from_kineto
from mlflow_neuron._trace.events import HOST
from mlflow_neuron._trace.timeline import CYCLE, KERNEL, OP, STEP, STREAM, SUMMARY, Timeline
from mlflow_neuron._trace.span_tree import build_timeline
from mlflow_neuron._trace.chrome import read_chrome_file
from mlflow_neuron._trace.kineto import timeline_inputs_from_kineto

TESTS = Path(__file__).parent
pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")


def assert_well_formed(timeline: Timeline, max_spans: int | None = None) -> None:
    """Parents come first, children lie within their parent's time, one root."""
    spans = timeline.spans
    assert spans[0].kind == CYCLE and spans[0].parent == -1
    assert sum(s.parent == -1 for s in spans) == 1
    for i, s in enumerate(spans[1:], 1):
        assert 0 <= s.parent < i, s
        p = spans[s.parent]
        assert s.start_ns <= s.end_ns
        assert p.start_ns <= s.start_ns and s.end_ns <= p.end_ns, (p, s)
    if max_spans is not None:
        assert len(spans) <= max_spans
    assert Timeline.from_json(timeline.to_json()) == timeline


def profile_cpu_cycle(steps: int = 2, **kwargs):
    """A cycle of naive RMSNorm steps; returns (timeline, prof.events() of the same cycle, origin)."""
    x, w = inputs()
    seen = {}

    def on_cycle(prof):
        raw = raw_events_from_kineto(prof)
        timeline_inputs = timeline_inputs_from_kineto(prof, raw)
        seen["timeline"] = build_timeline(raw, cycle_step=prof.step_num, inputs=timeline_inputs,
                                          root_name=cycle_dir(prof.step_num))  # as the callback names it
        seen["events"] = list(prof.events())
        seen["origin"] = timeline_inputs.origin_ns

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=steps),
                 on_trace_ready=on_cycle, **kwargs) as prof:  # fmt: skip
        for _ in range(steps + 1):
            rms_norm_naive(x, w)
            prof.step()
    return seen["timeline"], seen["events"], seen["origin"]


def test_spans_are_the_cycles_events_with_torchs_times_and_nesting():
    timeline, events, origin = profile_cpu_cycle(steps=2, record_shapes=True)
    assert_well_formed(timeline)
    assert origin is not None and abs(origin - timeline.spans[0].start_ns) < 60 * 10**9  # epoch ns
    spans = timeline.spans
    assert spans[0].name == "profiler/step_3" and timeline.dropped == 0

    def key(name, start_ns, end_ns):
        return name, start_ns, end_ns

    def event_key(e):  # FunctionEvent times are µs floats of whole ns relative to the trace start
        return key(e.name, round(e.time_range.start * 1000), round(e.time_range.end * 1000))

    by_key = {key(s.attributes["op_name"], s.start_ns - origin, s.end_ns - origin): i
              for i, s in enumerate(spans) if s.kind in (OP, STEP)}  # fmt: skip
    assert len(by_key) == sum(s.kind in (OP, STEP) for s in spans)
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    assert len(host) == len(by_key)
    steps = [s for s in spans if s.kind == STEP]
    assert [s.name for s in steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    for e in host:
        span = spans[by_key[event_key(e)]]
        if e.cpu_parent is None:  # the steps
            assert span.kind == STEP and span.parent == 0
        else:
            assert span.parent == by_key[event_key(e.cpu_parent)], e.name
        assert span.attributes["self_cpu_us"] == pytest.approx(e.self_cpu_time_total, abs=1e-3)
        assert span.attributes["total_cpu_us"] == pytest.approx(e.cpu_time_total, abs=1e-3)
        if e.input_shapes and any(e.input_shapes):
            assert span.attributes["input_shapes"] == e.input_shapes, e.name
    calls = Counter(e.name for e in host)
    assert all(s.attributes["calls"] == calls[s.attributes["op_name"]] for s in spans if s.kind in (OP, STEP))
    # the trace's times are the events' own: the cycle spans exactly its first to last event
    assert spans[0].start_ns == min(s.start_ns for s in spans[1:])
    assert spans[0].end_ns == max(s.end_ns for s in spans[1:])


def test_a_chrome_trace_of_the_cycle_gives_the_same_timeline(tmp_path):
    x, w = inputs()
    seen = {}

    def on_cycle(prof):
        raw = raw_events_from_kineto(prof)
        seen["kineto"] = build_timeline(raw, cycle_step=prof.step_num, inputs=timeline_inputs_from_kineto(prof, raw))
        prof.export_chrome_trace(str(tmp_path / "trace.json"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=on_cycle, record_shapes=True) as prof:  # fmt: skip
        for _ in range(3):
            rms_norm_naive(x, w)
            prof.step()
    cycle = read_chrome_file(tmp_path / "trace.json")
    from_file = build_timeline(cycle.raw, cycle_step=3, inputs=cycle.inputs)
    want, got = seen["kineto"], from_file

    def shape(t):
        return [(s.name, s.kind, s.start_ns, s.end_ns, s.parent, s.attributes.get("input_shapes")) for s in t.spans]

    # Kineto's JSON writes µs with three decimals: the same whole nanoseconds, the same tree.
    assert shape(got) == shape(want)


FAKE_SCENARIO = """
import json, pathlib, sys
import fake_device
fake_device.activate(pathlib.Path(sys.argv[1]))
from torch.profiler import ProfilerActivity, profile, schedule
from workloads import inputs, rms_norm_naive
from mlflow_neuron._trace.aggregate import aggregate
from mlflow_neuron._trace.chrome import raw_events_from_chrome_trace
from mlflow_neuron._trace.kineto import raw_events_from_kineto
from mlflow_neuron._trace.span_tree import build_timeline
from mlflow_neuron._trace.chrome import read_chrome_cycle
from mlflow_neuron._trace.kineto import timeline_inputs_from_kineto
x, w = inputs()
out = {}
def on_cycle(prof):
    raw = raw_events_from_kineto(prof)
    inputs = timeline_inputs_from_kineto(prof, raw)
    out["timelines"] = [build_timeline(raw, cycle_step=prof.step_num, max_spans=int(cap), inputs=inputs).to_json()
                        for cap in sys.argv[2].split(",")]
    p = aggregate(raw, device="neuron", device_profiled=True)
    prof.export_chrome_trace("trace.json")
    cycle = read_chrome_cycle(json.loads(pathlib.Path("trace.json").read_text()))
    out["from_file"] = build_timeline(cycle.raw, cycle_step=prof.step_num, inputs=cycle.inputs).to_json()
    out["ops"] = {f"{o.kind}:{o.name}": o.self_device_time_us for o in p.ops}
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
             schedule=schedule(wait=0, warmup=1, active=2), on_trace_ready=on_cycle) as prof:
    for _ in range(3):
        rms_norm_naive(x, w)
        prof.step()
print(json.dumps(out))
"""


def fake_device_cycle(fake_profiler, tmp_path, caps=(2000,)):
    """One fake-device cycle: its timeline at each cap, its ops' self device time, and the
    timeline of its chrome trace."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
           "FAKE_NEURON_MODE": "kernels", "FAKE_NEURON_KERNELS": "aten::mul=785,aten::rsqrt=40,aten::add=20"}  # fmt: skip
    result = subprocess.run([sys.executable, "-c", FAKE_SCENARIO, str(fake_profiler), ",".join(map(str, caps))],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    return [Timeline.from_json(t) for t in out["timelines"]], out["ops"], Timeline.from_json(out["from_file"])


def test_kernels_sit_under_their_stream_with_their_ops_device_time(fake_profiler, tmp_path):
    [timeline], ops, from_file = fake_device_cycle(fake_profiler, tmp_path)
    assert_well_formed(timeline)
    spans = timeline.spans
    streams = [i for i, s in enumerate(spans) if s.kind == STREAM]
    assert [spans[i].name for i in streams] == ["NEURON 0 stream 0"]  # the fake device's one stream
    kernels = [s for s in spans if s.kind == KERNEL]
    assert len(kernels) == 2 * (3 + 1 + 1) and all(s.parent == streams[0] for s in kernels)
    assert spans[streams[0]].attributes["kernels"] == len(kernels)
    # Each kernel names its launching op and links to it by correlation id.
    ops_by_id = {s.attributes["correlation_id"]: s for s in spans if s.kind == OP and "correlation_id" in s.attributes}
    device_us = defaultdict(float)
    for k in kernels:
        launcher = ops_by_id[k.attributes["correlation_id"]]
        assert k.attributes["launched_by"] == launcher.name == k.name.removeprefix("neuron_kernel::")
        assert k.attributes["device_us"] == (k.end_ns - k.start_ns) / 1000
        assert launcher.attributes["self_device_us"] == pytest.approx(k.attributes["device_us"])
        device_us[launcher.name] += k.attributes["device_us"]
    # ... and the kernels' durations per op are the op's device time in the cycle's metrics.
    assert dict(device_us) == pytest.approx({"aten::mul": 2 * 3 * 785, "aten::rsqrt": 2 * 40, "aten::add": 2 * 20})
    assert dict(device_us) == pytest.approx({name: ops[f"op:{name}"] for name in device_us})
    # The cycle's chrome trace gives the same trace (ingest): its stream is named by the trace.
    renamed = {spans[streams[0]].name: from_file.spans[streams[0]].name}
    assert renamed[spans[streams[0]].name].endswith("stream 0")

    def shape(t, rename=None):
        return [((rename or {}).get(s.name, s.name), s.kind, s.start_ns, s.end_ns, s.parent,
                 {k: v for k, v in s.attributes.items() if k not in ("thread", "stream")}) for s in t.spans]  # fmt: skip

    assert shape(from_file) == shape(timeline, renamed)
    # An op above a launching op carries its children's device time in total, none itself.
    step = next(s for s in spans if s.kind == STEP)
    assert step.attributes["self_device_us"] == 0


def test_small_caps_keep_every_step_and_summarize_the_rest(fake_profiler, tmp_path):
    caps = (12, 30, 60)
    (full, *capped), _, _ = fake_device_cycle(fake_profiler, tmp_path, caps=(2000, *caps))
    assert full.dropped == 0 and len(full.spans) > 60
    for cap, timeline in zip(caps, capped):
        assert_well_formed(timeline, max_spans=cap)
        assert_summaries_account_for_everything(timeline, full)


def assert_summaries_account_for_everything(timeline: Timeline, full: Timeline) -> None:
    """Kept spans are spans of the uncapped timeline; the summaries count every one left out, and
    their times are the dropped spans' own (outermost ones only)."""
    kinds = Counter(s.kind for s in timeline.spans)
    assert kinds[STEP] == sum(s.kind == STEP for s in full.spans)
    assert kinds[STREAM] == sum(s.kind == STREAM for s in full.spans)
    key = lambda s: (s.name, s.start_ns, s.end_ns)  # noqa: E731
    full_keys = {key(s): i for i, s in enumerate(full.spans)}
    kept = {full_keys[key(s)] for s in timeline.spans if s.kind != SUMMARY}
    summaries = [s for s in timeline.spans if s.kind == SUMMARY]
    dropped = len(full.spans) - len(kept)
    assert dropped == timeline.dropped == sum(s.attributes["dropped_spans"] for s in summaries)
    assert timeline.events == len(full.spans)
    # per kept parent: the time of dropped spans whose parent (in the full tree) is kept
    want = defaultdict(int)
    for i, s in enumerate(full.spans):
        if i not in kept and s.parent in kept:
            want[key(full.spans[s.parent])] += s.end_ns - s.start_ns
    got = {key(timeline.spans[s.parent]): s.attributes["dropped_time_us"] for s in summaries}
    assert got == pytest.approx({k: v / 1000 for k, v in want.items()})
    for s in summaries:
        assert s.name.startswith(f"\u2026 {s.attributes['dropped_spans']} more ")


def test_a_100k_op_cycle_stays_within_the_cap():
    a, b = torch.ones(4), torch.ones(4)
    steps, per_step = 10, 10_000
    seen = {}

    def on_cycle(prof):
        raw = raw_events_from_kineto(prof)
        seen["raw"] = raw
        seen["timeline"] = build_timeline(raw, cycle_step=prof.step_num)

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=on_cycle) as prof:  # fmt: skip
        prof.step()  # an empty warmup step
        for _ in range(steps):
            for _ in range(per_step):
                torch.add(a, b)
            prof.step()
    timeline, raw = seen["timeline"], seen["raw"]
    assert_well_formed(timeline, max_spans=2000)
    spans = timeline.spans
    assert len(spans) == 2000 and sum(s.kind == STEP for s in spans) == steps
    # Per step: kept adds plus the summary's count are the step's adds, and their times add up.
    host = raw.device_class == HOST
    names = np.array(raw.names, dtype=object)[raw.name_id]
    add = host & (names == "aten::add")
    assert add.sum() == steps * per_step
    starts, durations = raw.start_ns[add], raw.end_ns[add] - raw.start_ns[add]
    kept_longest = sorted((s.end_ns - s.start_ns for s in spans if s.kind == OP), reverse=True)
    for step in (s for s in spans if s.kind == STEP):
        index = spans.index(step)
        children = [s for s in spans if s.parent == index]
        ops = [s for s in children if s.kind == OP]
        [summary] = [s for s in children if s.kind == SUMMARY]
        inside = (starts >= step.start_ns) & (starts < step.end_ns)
        assert len(ops) + summary.attributes["dropped_spans"] == inside.sum() == per_step
        total_ns = int(durations[inside].sum())
        kept_ns = sum(s.end_ns - s.start_ns for s in ops)
        assert summary.attributes["dropped_time_us"] == pytest.approx((total_ns - kept_ns) / 1000)
    # The longest ops are the ones kept.
    shortest_kept = kept_longest[-1]
    assert (durations > shortest_kept).sum() <= len(kept_longest)


def test_cap_and_empty_cycles():
    with pytest.raises(ValueError, match="max_spans"):
        build_timeline(raw_events_from_chrome_trace({"traceEvents": []}), cycle_step=1, max_spans=0)
    empty = build_timeline(raw_events_from_chrome_trace({"traceEvents": []}), cycle_step=7, root_name="profiler/step_7")
    assert [s.name for s in empty.spans] == ["profiler/step_7"]
    unnamed = build_timeline(raw_events_from_chrome_trace({"traceEvents": []}), cycle_step=7)
    assert [s.name for s in unnamed.spans] == ["cycle 7"]  # the product always names it (`_record.model.cycle_dir`)


def test_timeline_imports_without_mlflow():
    code = ("import sys; sys.modules['mlflow'] = None\n"
            "import mlflow_neuron._trace.timeline, mlflow_neuron._trace.span_tree, mlflow_neuron._trace.summarize, "
            "mlflow_neuron._report.timeline_svg\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


# -- the MLflow trace ----------------------------------------------------------------------------------


def cycle_traces(client: MlflowClient, experiment_id: str, run_id: str) -> list:
    return list(client.search_traces(locations=[experiment_id], run_id=run_id, flush=True))


def test_the_trace_in_a_real_store_is_the_timeline_linked_to_the_run_once(tracking_uri):
    from mlflow_neuron._delivery.traces import CYCLE_KEY_TAG, marked_steps, log_timeline

    timeline, _, _ = profile_cpu_cycle(steps=2, record_shapes=True)
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("timeline")
    run_id = client.create_run(experiment_id, run_name="naive").info.run_id
    trace_id = log_timeline(client, run_id, experiment_id, timeline, device="cpu", run_name="naive")
    assert log_timeline(client, run_id, experiment_id, timeline, device="cpu", run_name="naive") == trace_id

    [trace] = cycle_traces(client, experiment_id, run_id)  # linked to the run, and only once
    assert trace.info.trace_id == trace_id
    assert {k: v for k, v in trace.info.tags.items() if k.startswith("mlflow_neuron.")} == {
        CYCLE_KEY_TAG: f"{run_id}/3", "mlflow_neuron.run_id": run_id,
        "mlflow_neuron.step": "3", "mlflow_neuron.device": "cpu", "mlflow_neuron.run_name": "naive",
        "mlflow_neuron.spans": str(len(timeline.spans)), "mlflow_neuron.spans_dropped": "0",
    }  # fmt: skip
    assert trace.info.request_time == timeline.spans[0].start_ns // 1_000_000
    # Complete: the run's mark at the cycle's step, once (the second call found it and wrote nothing).
    assert [(p.step, p.value) for p in client.get_metric_history(run_id, "profiler/timeline/spans")] == [
        (3, len(timeline.spans))]
    assert marked_steps(client, run_id) == {3}
    assert trace.info.tags.get("mlflow.trace.spansLocation") != "TRACKING_STORE"  # one artifact, not 2,000 rows
    # Every span comes back with its times, its parent and its attributes.
    got = sorted(trace.data.spans, key=lambda s: int(s.span_id, 16))
    assert len(got) == len(timeline.spans)
    for i, (span, want) in enumerate(zip(got, timeline.spans)):
        assert int(span.span_id, 16) == i + 1
        assert (span.name, span.start_time_ns, span.end_time_ns) == (want.name, want.start_ns, want.end_ns)
        assert span.parent_id == (None if want.parent < 0 else f"{want.parent + 1:016x}")
        assert {k: span.attributes[k] for k in want.attributes} == want.attributes
    assert got[0].name == "profiler/step_3" and got[1].name == "ProfilerStep#1"
    mul = next(s for s in got if s.name == "aten::mul")
    assert mul.attributes["input_shapes"] == [[4, 512], [4, 512]] and mul.attributes["calls"] == 6


def test_the_trace_text_written_a_template_per_span_shape_is_the_text_written_value_by_value():
    """The spans that share a kind and attribute names are written by one template; what a template
    cannot say exactly (the root, mixed or odd values, `%` in a name) goes value by value. Both give
    the same text, and MLflow reads each value back."""
    from mlflow.entities import Span

    from mlflow_neuron._record.trace_text import TraceDraft, _json_string, _span_text, trace_data_text
    from mlflow_neuron._delivery.traces import trace_id_for

    timeline, _, _ = profile_cpu_cycle(steps=2, record_shapes=True)
    odd = [dict(name="root%s", kind="cycle", start_ns=1, end_ns=9, parent=-1, attributes={"step": 3}),
           *({"name": f"a\u00e9\"%d{k}", "kind": "op%", "start_ns": 2, "end_ns": 5, "parent": 0,
              "attributes": {"x%s": "v%" if k else "w\n\u2026", "b": k == 0, "n": None, "l": [[1, k]], "f": 1.5}}
             for k in range(3)),
           dict(name="d", kind="op", start_ns=2, end_ns=5, parent=1, attributes={"m": 1, "g": 2.25}),
           dict(name="e", kind="op", start_ns=2, end_ns=5, parent=1, attributes={"m": 1.0, "g": float("nan")}),
           dict(name="f", kind="op", start_ns=3, end_ns=4, parent=1, attributes={"i": 10**20, "f": 0.1}),
           dict(name="g", kind="op", start_ns=3, end_ns=4, parent=1, attributes={"i": -5, "f": float("inf")}),
           *(dict(name="h", kind="summary", start_ns=3, end_ns=4, parent=2, attributes={}) for _ in range(2))]
    for draft in (TraceDraft.of(timeline), TraceDraft("odd", 1, 0, 0, odd)):
        for shift in (0, 7):
            trace_id = trace_id_for("run%d/3")
            text = trace_data_text(draft, trace_id, shift)
            quoted = _json_string(trace_id)
            fixed = '"mlflow.traceRequestId":' + _json_string(quoted) + ',"mlflow.spanType":"\\"UNKNOWN\\"","kind":'
            each = ",".join(_span_text(s, i, quoted, fixed, {}, shift) for i, s in enumerate(draft.spans))
            assert text == '{"spans":[' + each + "]}"
            spans = [Span.from_dict(d) for d in json.loads(text)["spans"]]
            for span, want in zip(spans, draft.spans):
                assert (span.name, span.start_time_ns - shift, span.parent_id is None) == (
                    want["name"], want["start_ns"], want["parent"] < 0)
                got = {k: span.attributes[k] for k in want["attributes"]}
                assert json.dumps(got) == json.dumps(want["attributes"])  # NaN included
    assert len(spans) == len(odd)


def test_a_partial_write_is_replaced_and_other_processes_find_the_complete_trace(tracking_uri, tmp_path):
    from mlflow.entities import TraceInfo, TraceLocation, TraceState
    from mlflow.tracing.client import TracingClient

    from conftest import run_python
    from mlflow_neuron._delivery.traces import CYCLE_KEY_TAG, marked_steps, mlflow_spans, trace_id_for

    timeline, _, _ = profile_cpu_cycle(steps=1)
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("timeline")
    run_id = client.create_run(experiment_id).info.run_id
    key = f"{run_id}/{timeline.cycle_step}"
    # A process died mid-write: half the spans under the cycle's id, and an untagged-complete
    # trace with the key under another id.
    tracing = TracingClient(tracking_uri)
    tracing.log_spans(experiment_id, mlflow_spans(timeline, trace_id_for(key))[: len(timeline.spans) // 2])
    other = "tr-" + "0" * 31 + "1"
    tracing.log_spans(experiment_id, mlflow_spans(timeline, other)[:3])
    tracing.start_trace(TraceInfo(trace_id=other, trace_location=TraceLocation.from_experiment_id(experiment_id),
                                  request_time=1, state=TraceState.OK, tags={CYCLE_KEY_TAG: key}))  # fmt: skip
    client.link_traces_to_run([other], run_id)
    assert len(cycle_traces(client, experiment_id, run_id)) == 1  # the half-written one is not linked

    path = tmp_path / "timeline.json"
    path.write_text(timeline.to_json())
    code = f"""
import pathlib
from mlflow import MlflowClient
from mlflow_neuron._trace.timeline import Timeline
from mlflow_neuron._delivery.traces import log_timeline
timeline = Timeline.from_json(pathlib.Path({str(path)!r}).read_text())
print(log_timeline(MlflowClient({tracking_uri!r}), {run_id!r}, {experiment_id!r}, timeline))
"""
    for _ in range(2):  # `sync` twice, each a process of its own
        result = run_python(code, tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1] == trace_id_for(key)
    [trace] = cycle_traces(client, experiment_id, run_id)
    assert trace.info.trace_id == trace_id_for(key) and marked_steps(client, run_id) == {timeline.cycle_step}
    assert len(trace.data.spans) == len(timeline.spans)
    everything = client.search_traces(locations=[experiment_id], flush=True)
    assert [t.info.trace_id for t in everything] == [trace_id_for(key)]


def test_a_trace_linked_but_not_marked_is_written_again_and_an_earlier_versions_tag_still_counts(tracking_uri):
    """A process killed between linking a batch's traces and marking them leaves traces that look
    whole but were never marked: the next attempt writes them again, once. A trace that an earlier
    version tagged complete is kept as it is."""
    from mlflow_neuron._delivery import traces

    timeline, _, _ = profile_cpu_cycle(steps=1)
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("timeline")
    run_id, old_run = (client.create_run(experiment_id).info.run_id for _ in range(2))
    for run in (run_id, old_run):
        key = traces.cycle_key(run, timeline.cycle_step)
        traces._write_trace(client, run, experiment_id, timeline, traces.trace_id_for(key),
                            traces._trace_tags(timeline, key, run, None, None))  # fmt: skip
        client.link_traces_to_run([traces.trace_id_for(key)], run)
    client.set_trace_tag(traces.trace_id_for(traces.cycle_key(old_run, timeline.cycle_step)), traces.COMPLETE_TAG,
                         traces.COMPLETE)  # fmt: skip

    for run in (run_id, old_run):
        for _ in range(2):
            assert traces.log_timeline(client, run, experiment_id, timeline) == traces.trace_id_for(
                traces.cycle_key(run, timeline.cycle_step))
        [trace] = cycle_traces(client, experiment_id, run)
        assert len(trace.data.spans) == len(timeline.spans)
    # Written again and marked once; the earlier version's trace was not touched.
    assert [p.step for p in client.get_metric_history(run_id, traces.MARK_METRIC)] == [timeline.cycle_step]
    assert client.get_metric_history(old_run, traces.MARK_METRIC) == []


def test_a_timeline_without_an_epoch_origin_ends_at_logging_time(tracking_uri):
    import time

    from mlflow_neuron._delivery.traces import log_timeline

    x = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": 10.0, "dur": 5.5, "pid": 1, "tid": 1}]}
    timeline = build_timeline(raw_events_from_chrome_trace(x), cycle_step=1)
    assert timeline.origin_ns == 0 and timeline.spans[1].end_ns - timeline.spans[1].start_ns == 5500
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("timeline")
    run_id = client.create_run(experiment_id).info.run_id
    before = time.time_ns()
    log_timeline(client, run_id, experiment_id, timeline)
    [trace] = cycle_traces(client, experiment_id, run_id)
    root = next(s for s in trace.data.spans if s.parent_id is None)
    assert before <= root.end_time_ns <= time.time_ns() and root.end_time_ns - root.start_time_ns == 5500


# -- the SVG timeline ----------------------------------------------------------------------------------


def test_representative_step_is_the_one_closest_to_the_median():
    from mlflow_neuron._analysis.timeline_step import representative_step

    assert representative_step({1: 10.0, 2: 50.0, 3: 11.0, 4: 12.0, 5: 13.0}) == 4
    assert representative_step({7: 10.0, 8: 20.0}) == 7  # median 15: a tie, the lower step
    assert representative_step({3: 5.0}) == 3
    with pytest.raises(ValueError):
        representative_step({})


def test_svg_of_a_step_draws_its_ops_and_kernels_self_contained(fake_profiler, tmp_path):
    import xml.etree.ElementTree as ET

    from mlflow_neuron._analysis.timeline_step import representative_step, step_durations_us
    from mlflow_neuron._report.timeline_svg import timeline_svg

    [timeline], _, _ = fake_device_cycle(fake_profiler, tmp_path)
    durations = step_durations_us(timeline)
    assert sorted(durations) == [1, 2]
    step = representative_step(durations)
    svg = timeline_svg(timeline, step)
    root = ET.fromstring(svg)  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    assert not any(e.tag in (f"{ns}script", f"{ns}a", f"{ns}image", f"{ns}foreignObject") for e in root.iter())
    assert "href" not in svg and "javascript" not in svg.lower() and "url(" not in svg
    tips = [e.text for e in root.iter(f"{ns}title")]
    [top] = [i for i, s in enumerate(timeline.spans) if s.kind == STEP and s.attributes["step"] == step]
    in_step = {s.name for i, s in enumerate(timeline.spans) if s.parent == top}
    assert in_step <= {t.split(" | ")[0] for t in tips}
    labels = [e.text for e in root.iter(f"{ns}text")]
    assert "thread" in " ".join(labels) and "NEURON 0 stream 0" in labels
    assert sum(t.startswith("neuron_kernel::aten::mul") for t in tips) == 3  # the step's three muls
    whole = ET.fromstring(timeline_svg(timeline))
    assert sum((e.text or "").startswith("neuron_kernel::") for e in whole.iter(f"{ns}title")) == 10
    with pytest.raises(ValueError, match="step 99"):
        timeline_svg(timeline, 99)


@pytest.mark.parametrize("settings", [{}, {"profile_memory": True, "record_shapes": True}])
def test_read_kineto_cycle_reads_what_raw_events_from_kineto_reads(settings):
    """One read for both; `[memory]` records (filtered, some re-added at the end) take the
    name-matching path instead of the identity one."""
    from dataclasses import fields

    from mlflow_neuron._trace.kineto import read_kineto_cycle

    x, w = inputs()
    seen = {}

    def on_cycle(prof):
        seen["want"] = raw_events_from_kineto(prof)
        seen["got"] = read_kineto_cycle(prof)
        seen["origin"] = prof.profiler.kineto_results.trace_start_ns()

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=on_cycle, **settings) as prof:  # fmt: skip
        for _ in range(2):
            rms_norm_naive(x, w)
            prof.step()
    want, (got, timeline_inputs) = seen["want"], seen["got"]
    for f in fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b), f.name
    assert timeline_inputs.origin_ns == seen["origin"]
    assert timeline_inputs.lanes is not None and timeline_inputs.input_shapes is not None
    shapes = timeline_inputs.input_shapes(np.arange(len(got)))
    names = [got.names[i] for i in got.name_id]
    mul = [s for n, s in zip(names, shapes) if n == "aten::mul"]
    assert mul == ([[[4, 512], [4, 512]], [[4, 512], [4, 1]], [[4, 512], [512]]] if settings else [None] * 3)


def test_each_row_knows_the_event_it_was_read_from(tmp_path):
    """`RawEvents.source_index`, in both readers: what the timeline's streams and shapes read
    back. `record_function` and `profile_memory` add events the readers filter."""
    from torch.profiler import record_function

    x, w = inputs()
    seen = {}

    def on_cycle(prof):
        seen["raw"] = raw_events_from_kineto(prof)
        seen["events"] = prof.profiler.kineto_results.events()
        prof.export_chrome_trace(str(tmp_path / "trace.json"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=on_cycle, profile_memory=True) as prof:  # fmt: skip
        for _ in range(2):
            with record_function("block"):
                rms_norm_naive(x, w)
            prof.step()
    raw, events = seen["raw"], seen["events"]
    assert len(raw) < len(events)  # some events filtered: the rows are not the events' positions
    assert [events[k].name() for k in raw.source_index.tolist()] == [raw.names[i] for i in raw.name_id]
    trace = json.loads((tmp_path / "trace.json").read_text())
    raw = raw_events_from_chrome_trace(trace)
    found = [trace["traceEvents"][k] for k in raw.source_index.tolist()]
    assert [e["name"] for e in found] == [raw.names[i] for i in raw.name_id]
    assert any(e["name"] == "block" for e in found)


def test_top_level_ops_of_other_threads_go_under_the_step_they_start_in():
    """torch nests per thread; a worker thread's top-level op has no parent there. (This torch
    records no ops of threads started inside the profile, so the trace is written by hand.)"""

    def op(name, ts, dur, tid, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}

    trace = {"traceEvents": [
        op("ProfilerStep#1", 0.0, 100.0, 1, "user_annotation"), op("aten::sub", 10.0, 10.0, 1),
        op("aten::add", 30.0, 10.0, 2), op("aten::empty", 31.0, 2.0, 2), op("aten::mul", 110.0, 5.0, 2),
        op("ProfilerStep#2", 120.0, 50.0, 1, "user_annotation"), op("aten::div", 119.0, 60.0, 2),
    ]}  # fmt: skip
    timeline = build_timeline(raw_events_from_chrome_trace(trace), cycle_step=2)
    spans = timeline.spans
    by_name = {s.name: s for s in spans}
    assert [s.name for s in spans[1:3]] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert spans[by_name["aten::sub"].parent].name == "ProfilerStep#1"
    assert spans[by_name["aten::add"].parent].name == "ProfilerStep#1"  # another thread, same step
    assert spans[by_name["aten::empty"].parent].name == "aten::add"
    assert by_name["aten::add"].attributes["thread"] != by_name["aten::sub"].attributes["thread"]
    assert by_name["aten::mul"].parent == 0  # between steps: under the cycle
    assert by_name["aten::div"].parent == 0  # starts before step 2
    for i, s in enumerate(spans[1:], 1):
        assert s.parent < i


def test_the_trace_through_a_real_tracking_server(tmp_path):
    """The sender talks to an `mlflow server`: REST trace calls, spans uploaded through the
    server's proxied artifacts, the same exactly-once."""
    from servers import MlflowServer

    from mlflow_neuron._delivery.traces import log_timeline, marked_steps

    timeline, _, _ = profile_cpu_cycle(steps=1)
    with MlflowServer(tmp_path / "server") as server:
        client = MlflowClient(server.uri)
        experiment_id = client.create_experiment("timeline")
        run_id = client.create_run(experiment_id).info.run_id
        for _ in range(3):
            trace_id = log_timeline(client, run_id, experiment_id, timeline)
        # Reading spans from an artifact resolves `mlflow-artifacts:` against the process-wide
        # URI (MLflow 3.17), whatever the client's; writing does not depend on it.
        mlflow.set_tracking_uri(server.uri)
        try:
            [trace] = cycle_traces(client, experiment_id, run_id)
        finally:
            mlflow.set_tracking_uri(None)
        assert trace.info.trace_id == trace_id and marked_steps(client, run_id) == {timeline.cycle_step}
        got = sorted(trace.data.spans, key=lambda s: int(s.span_id, 16))
        assert [(s.name, s.start_time_ns, s.end_time_ns) for s in got] == [
            (s.name, s.start_ns, s.end_ns) for s in timeline.spans
        ]
