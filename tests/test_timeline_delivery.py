"""Issue 12, phase 2: the callback, the outbox, sync, ingest and the HTML report each turn a
cycle's timeline into exactly one MLflow trace (or an SVG), on a real sqlite store."""

from __future__ import annotations

import json
import re
import shutil
import statistics

import mlflow
import pytest
from conftest import profile_offline
from mlflow.tracking import MlflowClient
from workloads import profile_rmsnorm

from mlflow_neuron import MLflowProfilerCallback, compare_runs, load_timelines, render
from mlflow_neuron._capture.ingest import ingest
from mlflow_neuron._record.trace_text import TraceDraft
from mlflow_neuron._delivery.traces import CYCLE_KEY_TAG, marked_steps, mlflow_spans
from mlflow_neuron._record.model import RunRef
from mlflow_neuron._delivery.outbox import load, pending
from mlflow_neuron._delivery.seal import seal
from mlflow_neuron.cli import main as cli_main

pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")


def traces_of(client: MlflowClient, run_id: str) -> list:
    experiment_id = client.get_run(run_id).info.experiment_id
    return list(client.search_traces(locations=[experiment_id], run_id=run_id, flush=True))


def by_step(traces: list) -> dict[int, object]:
    steps = [int(t.info.tags["mlflow_neuron.step"]) for t in traces]
    assert len(steps) == len(set(steps)), f"more than one trace for a cycle: {sorted(steps)}"
    return dict(zip(steps, traces))


def profile_into(run_id: str, steps=8, **kwargs) -> MLflowProfilerCallback:
    with MLflowProfilerCallback(run_id=run_id, strict=True, **kwargs) as callback:
        profile_rmsnorm(callback, steps=steps, wait=1, warmup=1, active=2)
    return callback


def test_each_cycle_is_one_trace_linked_to_its_run_within_the_cap(tracking_uri):
    client = MlflowClient(tracking_uri)
    with mlflow.start_run(run_name="naive") as run:
        profile_into(run.info.run_id, timeline_max_spans=12)
    run_id = run.info.run_id
    traces = by_step(traces_of(client, run_id))
    assert sorted(traces) == [4, 8] == sorted(marked_steps(client, run_id))  # one per cycle, each complete
    for step, trace in traces.items():
        tags = trace.info.tags
        assert tags[CYCLE_KEY_TAG] == f"{run_id}/{step}"
        assert (tags["mlflow_neuron.device"], tags["mlflow_neuron.run_name"]) == ("cpu", "naive")
        spans = trace.data.spans
        assert len(spans) == int(tags["mlflow_neuron.spans"]) <= 12
        assert int(tags["mlflow_neuron.spans_dropped"]) > 0  # 12 spans do not hold two RMSNorm steps
        names = [s.name for s in spans]
        assert names[0] == f"profiler/step_{step}"
        assert {f"ProfilerStep#{step - 2}", f"ProfilerStep#{step - 1}"} <= set(names)
        assert any(n.startswith("\u2026 ") for n in names)  # the summarized ops
    # The timeline stays with the cycle's files, for the HTML report.
    assert "profiler/step_4/timeline.json" in [a.path for a in client.list_artifacts(run_id, "profiler/step_4")]


def test_log_timeline_false_logs_no_trace_and_no_timeline_file(tracking_uri):
    client = MlflowClient(tracking_uri)
    with mlflow.start_run() as run:
        profile_into(run.info.run_id, steps=4, log_timeline=False)
    assert traces_of(client, run.info.run_id) == []
    files = [a.path for a in client.list_artifacts(run.info.run_id, "profiler/step_4")]
    assert "profiler/step_4/ops.json" in files and "profiler/step_4/timeline.json" not in files
    assert client.get_metric_history(run.info.run_id, "profiler/total/active_steps")  # the rest is there


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "2000", None])
def test_timeline_max_spans_is_checked_at_construction(bad, tracking_uri):
    with pytest.raises(ValueError, match="timeline_max_spans must be an int >= 1"):
        MLflowProfilerCallback(run_id="0" * 32, timeline_max_spans=bad)


def test_offline_cycles_keep_their_timeline_and_sync_logs_one_trace_each(sync_store, dead_server, tmp_path):
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox, cycles=3)
    records = pending(outbox)
    assert len(records) == 3
    for record in records:
        delivery, _ = load(record)
        assert delivery.timeline == "timeline.json"
        assert json.loads((record / "files" / "timeline.json").read_text())["cycle_step"] == delivery.step

    backup = tmp_path / "backup"
    shutil.copytree(outbox, backup)
    # A partial replay (the first record only), then everything, twice.
    rest = tmp_path / "rest"
    shutil.move(str(outbox), str(rest))
    outbox.mkdir()
    shutil.move(str(rest / records[0].name), str(outbox / records[0].name))
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    for _ in range(2):
        shutil.rmtree(outbox)
        shutil.copytree(backup, outbox)
        assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])
    traces = by_step(traces_of(client, run.info.run_id))
    assert sorted(traces) == [4, 8, 12]
    assert marked_steps(client, run.info.run_id) == {4, 8, 12}
    assert {t.info.tags["mlflow_neuron.run_name"] for t in traces.values()} == {"offline"}


def test_the_trace_data_written_ahead_is_what_the_timeline_gives_and_no_artifact(sync_store, dead_server, tmp_path):
    """A prepared cycle holds its trace's data under a stand-in id (the helper writes it before
    it has MLflow); sent, its spans are those timeline.json gives for the cycle's real trace id,
    and the file is not among the cycle's artifacts."""
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox, cycles=2)
    timelines = {load(r)[0].step: TraceDraft.from_json((r / "files" / "timeline.json").read_bytes())
                 for r in pending(outbox)}  # fmt: skip
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])
    traces = by_step(traces_of(client, run.info.run_id))
    assert sorted(traces) == sorted(timelines) == [4, 8]
    for step, trace in traces.items():
        expected = mlflow_spans(timelines[step], trace.info.trace_id)
        assert [s.to_dict() for s in trace.data.spans] == [s.to_dict() for s in expected]
        names = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run.info.run_id, f"profiler/step_{step}")}
        assert "timeline.json" in names and not any(n.startswith(".") for n in names)


def test_an_outbox_record_from_before_timelines_still_syncs(sync_store, dead_server, tmp_path):
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox, cycles=1)
    [record] = pending(outbox)
    data = json.loads((record / "record.json").read_text())
    del data["timeline"], data["checks"]  # records from before timelines had no seal either
    (record / "record.json").write_text(json.dumps(data))
    (record / "files" / "timeline.json").unlink()
    assert load(record)[0].timeline is None
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])
    assert traces_of(client, run.info.run_id) == []
    assert client.get_metric_history(run.info.run_id, "profiler/total/active_steps")


@pytest.mark.parametrize("damaged", ["timeline.json", ".trace_spans.json"])
def test_a_damaged_timeline_file_skips_the_trace_and_the_cycle_still_syncs(sync_store, dead_server, tmp_path, damaged):
    """The trace is sent from the trace data written ahead (`.trace_spans.json`), or from
    timeline.json in a record of a version before it."""
    outbox = tmp_path / "outbox"
    profile_offline(dead_server, outbox, cycles=1)
    [record] = pending(outbox)
    data = json.loads((record / "record.json").read_text())
    assert data["trace_spans"] == ".trace_spans.json" and (record / "files" / ".trace_spans.json").is_file()
    if damaged == "timeline.json":  # a record of an earlier version
        data["trace_spans"] = None
        (record / "files" / ".trace_spans.json").unlink()
    (record / "files" / damaged).write_text('{"name": "truncat')
    # Written damaged, and sealed so (damage after sealing sets the whole record aside: test_sync_faults).
    data["checks"] = {k: v for k, v in seal(record).items() if k != "record.json"}
    (record / "record.json").write_text(json.dumps(data))
    assert cli_main(["sync", "--outbox", str(outbox), "--tracking-uri", sync_store]) == 0
    assert pending(outbox) == []
    client = MlflowClient(sync_store)
    [run] = client.search_runs(["0"])
    assert traces_of(client, run.info.run_id) == []
    assert client.get_metric_history(run.info.run_id, "profiler/total/active_steps")


def test_ingesting_the_cycles_trace_file_gives_the_same_trace(tracking_uri, tmp_path):
    client = MlflowClient(tracking_uri)
    exported = tmp_path / "exported"
    exported.mkdir()

    def export(prof):
        prof.export_chrome_trace(str(exported / f"cycle.{prof.step_num:04d}.pt.trace.json"))

    with mlflow.start_run(run_name="live") as run:
        with MLflowProfilerCallback(export, run_id=run.info.run_id, strict=True) as callback:
            profile_rmsnorm(callback, steps=8, wait=1, warmup=1, active=2, record_shapes=True)
    experiment_id = run.info.experiment_id
    with open(tmp_path / "log.txt", "w") as log:
        ingested_id, cycles = ingest(exported, RunRef(tracking_uri, None, experiment_id, "ingested", "key-1"),
                                     max_file_bytes=2**30, out=log)  # fmt: skip
    assert cycles == 2
    live, ingested = by_step(traces_of(client, run.info.run_id)), by_step(traces_of(client, ingested_id))
    assert sorted(live) == sorted(ingested) == [4, 8]

    def shape(trace):
        # `thread` is a per-source ordinal (a chrome trace numbers its (pid, tid) pairs in file
        # order, Kineto its threads in event order): the same threads, other numbers.
        spans = sorted(trace.data.spans, key=lambda s: int(s.span_id, 16))
        return [(s.name, s.span_id, s.parent_id, s.start_time_ns, s.end_time_ns,
                 {k: v for k, v in s.attributes.items() if not k.startswith("mlflow.") and k != "thread"})
                for s in spans]  # fmt: skip

    for step in live:
        assert shape(ingested[step]) == shape(live[step])
        assert ingested[step].info.tags["mlflow_neuron.run_name"] == "ingested"


def test_the_html_report_draws_one_representative_step_per_variant(tracking_uri, tmp_path):
    runs = {}
    with mlflow.start_run(run_name="parent") as parent:
        for name, kwargs in (("naive", {}), ("fused", {}), ("untraced", {"log_timeline": False})):
            with mlflow.start_run(run_name=name, nested=True) as run:
                profile_into(run.info.run_id, steps=12, **kwargs)
            runs[name] = run.info.run_id
    frame = compare_runs(list(runs.values()), baseline="naive")
    timelines = load_timelines(frame)
    assert timelines["untraced"].timeline is None and "log_timeline=False" in timelines["untraced"].note
    for name in ("naive", "fused"):
        chosen = timelines[name]
        keys = [tuple(k) for k in frame.attrs["sample_steps"][name]]
        totals = dict(zip(keys, frame.attrs["samples"][name]["TOTAL"]))
        median = statistics.median(totals.values())
        assert abs(totals[(chosen.cycle, chosen.step)] - median) == min(abs(v - median) for v in totals.values())
    page = render.html_page(frame, None, timelines=timelines)
    assert page.count("<svg") == 2
    assert "no timeline: " in page
    # Self-contained: no scripts, no links, nothing fetched.
    assert not re.search(r"<script|href=|src=\"(?!data:)|@import|url\(", page, re.IGNORECASE)
    for name in ("naive", "fused"):
        step = timelines[name].step
        assert f"ProfilerStep#{step}" in page
    # `compare --log-to` attaches the same page.
    assert cli_main(["compare", "--runs", *runs.values(), "--baseline", "naive", "--log-to",
                     parent.info.run_id, "--tracking-uri", tracking_uri]) == 0  # fmt: skip
    attached = MlflowClient(tracking_uri).download_artifacts(parent.info.run_id, "comparison/report.html", str(tmp_path))
    assert open(attached, encoding="utf-8").read().count("<svg") == 2
