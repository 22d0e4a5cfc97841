"""A cycle's `Timeline` as one MLflow trace, linked to the run: the Gantt in the run's Traces tab.

Example::

    client = MlflowClient(tracking_uri)
    trace_id = log_timeline(client, run_id, experiment_id, timeline, device="neuron", run_name="naive")

Exactly once per cycle. The trace id comes from the cycle key `<run_id>/<step>`, and the trace is
tagged with that key. Once a batch's traces are written and linked to the run (one request per
100), one `log_batch` marks them complete: the run's metric `profiler/timeline/spans` gets a
point at each cycle's step (its value: the trace's spans). That is one store write per batch,
where a tag on each trace was one per cycle, each a commit of its own on sqlite. Before writing,
unless this is the cycle's first attempt (`fresh`), the mark is looked for: a marked step means
done (its id is returned). Otherwise the experiment's traces with the key are searched: one
tagged `mlflow_neuron.timeline = complete` (earlier versions' mark, still read) is
kept; incomplete ones (a process died mid-write) are deleted, with any trace under the id, and
the trace is written again. So retries, `sync` twice, or a replay after a partial one leave one
trace.

Why not `MlflowClient.start_trace`/`start_span`/`end_span` (checked with MLflow 3.17 on sqlite):
those spans go through the process-wide tracer, which exports to `mlflow.get_tracking_uri()`, not
to the client's store; it exports asynchronously (a search right after `end_trace` misses the
trace); and on a sqlite store it writes every span in a transaction of its own (2,000 spans: ~10 s).
Here the finished spans are written the way MLflow's own exporter writes them:
`TracingClient(uri).start_trace(TraceInfo)`, then the spans as the trace's data artifact (one
file, as for stores without span logging; a sqlite store's span table took about 0.7 ms a span).
That is synchronous and goes only to `client`'s store. Checked with MLflow 3.17.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from mlflow.entities import Metric, Span, TraceInfo, TraceLocation, TraceState
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracing.client import TracingClient
from mlflow.tracing.utils.artifact_utils import get_artifact_uri_for_trace

from .._trace.json_text import parse
from .._trace.timeline import Timeline
from .._record.trace_text import TraceDraft, TraceText, span_count, trace_data_text

Cycle = Timeline | TraceDraft | TraceText  # what a cycle's trace is written from

CYCLE_KEY_TAG = "mlflow_neuron.cycle_key"
MARK_METRIC = "profiler/timeline/spans"  # a point at a cycle's step: its trace is complete (value: its spans)
COMPLETE_TAG = "mlflow_neuron.timeline"  # the mark of earlier versions, on the trace: still read
COMPLETE = "complete"


def cycle_key(run_id: str, step: int) -> str:
    return f"{run_id}/{step}"


def trace_id_for(key: str) -> str:
    """The trace id a cycle key always gets (MLflow's `tr-<32 hex>` form)."""
    return "tr-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def find_cycle_traces(client: Any, experiment_id: str, key: str) -> list:
    """TraceInfos of the experiment's traces tagged with this cycle key (complete or not)."""
    found, token = [], None
    while True:
        page = client.search_traces(
            locations=[experiment_id], filter_string=f"tag.`{CYCLE_KEY_TAG}` = '{_quoted(key)}'",
            include_spans=False, max_results=100, page_token=token,
        )  # fmt: skip
        found.extend(t.info for t in page)
        token = getattr(page, "token", None)
        if not token:
            return found


def log_timeline(client: Any, run_id: str, experiment_id: str, timeline: Cycle, *, device: str | None = None,
                 run_name: str | None = None, fresh: bool = False) -> str:  # fmt: skip
    """Logs `timeline` as a trace of `experiment_id` linked to `run_id`, once; returns its id.

    Tags: `mlflow_neuron.run_id`, `.step`, `.device`, `.run_name`, `.cycle_key`, `.spans`,
    `.spans_dropped`; the run's metric `profiler/timeline/spans` marks it complete at its step once
    everything is written. A timeline without an epoch origin (`origin_ns == 0`) is shifted to end
    now. `fresh`: no earlier attempt can have written this cycle, so no search for its earlier traces.
    """
    return log_timelines(client, run_id, experiment_id, [timeline], device=device, run_name=run_name, fresh=fresh)[0]


def log_timelines(client: Any, run_id: str, experiment_id: str, timelines: list[Cycle], *, device: str | None = None,
                  run_name: str | None = None, fresh: bool = False, marks: list | None = None) -> list[str]:  # fmt: skip
    """`log_timeline` for several cycles of one run: their links to the run and their marks in one
    request each. `marks`: the marks are added to it, for the caller's own `log_batch`, sent after
    this returns (the cycles' metrics and the marks in one request), instead of being logged here."""
    marked = set() if fresh else marked_steps(client, run_id)
    done = [_written_unless_complete(client, run_id, experiment_id, timeline, fresh, marked, device=device,
                                     run_name=run_name) for timeline in timelines]  # fmt: skip
    written = [timeline for timeline, (_, was_written) in zip(timelines, done) if was_written]
    if marks is None:
        mark_complete(client, run_id, written)
    else:
        link_to_run(client, run_id, written)
        marks.extend(complete_marks(written))
    return [trace_id for trace_id, _ in done]


def _written_unless_complete(client: Any, run_id: str, experiment_id: str, timeline: Cycle, fresh: bool,
                             marked: set[int] | None = None, **tags: Any) -> tuple[str, bool]:  # fmt: skip
    """(the cycle's trace id, whether it was written now): a complete trace of the cycle is kept.
    `marked`: the run's marked steps, when the caller read them already."""
    key = cycle_key(run_id, timeline.cycle_step)
    trace_id = trace_id_for(key)
    if not fresh:
        if timeline.cycle_step in (marked_steps(client, run_id) if marked is None else marked):
            return trace_id, False
        if (done := _complete_or_cleared(client, experiment_id, key, trace_id)) is not None:
            return done, False
    _write_trace(client, run_id, experiment_id, timeline, trace_id, _trace_tags(timeline, key, run_id, **tags))
    return trace_id, True


def mark_complete(client: Any, run_id: str, timelines: list[Cycle]) -> None:
    """Links the written traces of these cycles to the run (MLflow takes up to 100 a request),
    then marks them complete in one `log_batch`: only then does a later attempt take one as done."""
    link_to_run(client, run_id, timelines)
    marks = complete_marks(timelines)
    for first in range(0, len(marks), 1000):  # MLflow's limit of metrics per log_batch
        client.log_batch(run_id, metrics=marks[first : first + 1000], synchronous=True)


def link_to_run(client: Any, run_id: str, timelines: list[Cycle]) -> None:
    """Links the written traces of these cycles to the run (MLflow takes up to 100 a request)."""
    trace_ids = [trace_id_for(cycle_key(run_id, t.cycle_step)) for t in timelines]
    for first in range(0, len(trace_ids), 100):
        client.link_traces_to_run(trace_ids[first : first + 100], run_id)


def complete_marks(timelines: list[Cycle]) -> list[Metric]:
    """The marks that say these cycles' traces are complete: to be logged once they are linked."""
    now = int(time.time() * 1000)
    return [Metric(MARK_METRIC, float(span_count(t)), now, t.cycle_step) for t in timelines]


def marked_steps(client: Any, run_id: str) -> set[int]:
    """The steps whose cycle trace is complete (written, linked, marked)."""
    return {point.step for point in client.get_metric_history(run_id, MARK_METRIC)}


def _write_trace(client: Any, run_id: str, experiment_id: str, timeline: Cycle, trace_id: str,
                 tags: dict[str, str]) -> None:  # fmt: skip
    """The trace's info and spans, not linked nor complete yet."""
    if isinstance(timeline, TraceText):  # written when the cycle was prepared
        start, end, text = timeline.start_ns, timeline.end_ns, timeline.for_trace(trace_id)
    else:
        draft = TraceDraft.of(timeline)
        start, end = draft.spans[0]["start_ns"], draft.spans[0]["end_ns"]
        shift = 0 if draft.origin_ns else time.time_ns() - end
        start, end, text = start + shift, end + shift, trace_data_text(draft, trace_id, shift)
    tracing = TracingClient(client.tracking_uri)
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start // 1_000_000,
        execution_duration=(end - start) // 1_000_000,
        state=TraceState.OK,
        trace_metadata={"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3"},
        tags=tags,
    )
    stored = tracing.start_trace(info)
    # The client's URI, not the process-wide one: an `mlflow-artifacts:` location resolves
    # against it (MLflow's own `_upload_trace_data` takes the process-wide one).
    repo = get_artifact_repository(get_artifact_uri_for_trace(stored), tracking_uri=client.tracking_uri)
    repo.upload_trace_data(text)


def _complete_or_cleared(client: Any, experiment_id: str, key: str, trace_id: str) -> str | None:
    """The id of the cycle's complete trace, if one exists; else None, once every incomplete one
    (a process died mid-write) is deleted, with any trace under the cycle's own id."""
    existing = find_cycle_traces(client, experiment_id, key)
    done = sorted(t.trace_id for t in existing if t.tags.get(COMPLETE_TAG) == COMPLETE)
    keep = done[0] if done else None
    # Without a complete trace, the id itself may hold a partial write that carries no tags yet.
    stale = ({t.trace_id for t in existing} | ({trace_id} if keep is None else set())) - {keep}
    if stale:
        client.delete_traces(experiment_id=experiment_id, trace_ids=sorted(stale))
    return keep


def _trace_tags(timeline: Cycle, key: str, run_id: str, device: str | None, run_name: str | None) -> dict[str, str]:
    return {
        "mlflow.traceName": timeline.name,
        CYCLE_KEY_TAG: key,
        "mlflow_neuron.run_id": run_id,
        "mlflow_neuron.step": str(timeline.cycle_step),
        "mlflow_neuron.spans": str(span_count(timeline)),
        "mlflow_neuron.spans_dropped": str(timeline.dropped),
        **({"mlflow_neuron.device": device} if device else {}),
        **({"mlflow_neuron.run_name": run_name} if run_name else {}),
    }


def mlflow_spans(timeline: Timeline | TraceDraft, trace_id: str, shift_ns: int = 0) -> list[Span]:
    """The timeline's spans as MLflow `Span`s of `trace_id` (span ids: position + 1)."""
    return [Span.from_dict(d) for d in span_dicts(timeline, trace_id, shift_ns)]


def span_dicts(timeline: Timeline | TraceDraft, trace_id: str, shift_ns: int = 0) -> list[dict]:
    """The timeline's spans in the dict form `Span.from_dict` reads (attribute values JSON-encoded,
    as MLflow stores them; ids as hex)."""
    return parse(trace_data_text(TraceDraft.of(timeline), trace_id, shift_ns))["spans"]


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
