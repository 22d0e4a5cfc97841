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
`TracingClient(uri).start_trace(TraceInfo)`, then the spans as the trace's data artifact (as
for stores without span logging), or with `span_storage="tracking_store"` as `Span`s through
`log_spans` in one batch first. That is synchronous and goes only to `client`'s store. Checked
with MLflow 3.17.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from mlflow.entities import Metric, Span, TraceInfo, TraceLocation, TraceState
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracing.client import TracingClient
from mlflow.tracing.utils.artifact_utils import get_artifact_uri_for_trace

from .._trace.json_text import parse
from .._trace.timeline import Timeline

CYCLE_KEY_TAG = "mlflow_neuron.cycle_key"
MARK_METRIC = "profiler/timeline/spans"  # a point at a cycle's step: its trace is complete (value: its spans)
COMPLETE_TAG = "mlflow_neuron.timeline"  # the mark of earlier versions, on the trace: still read
COMPLETE = "complete"
_SPANS_IN_STORE = ("mlflow.trace.spansLocation", "TRACKING_STORE")
SPAN_STORAGE = ("artifact", "tracking_store")


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


def log_timeline(
    client: Any,
    run_id: str,
    experiment_id: str,
    timeline: Timeline | TraceDraft,
    *,
    device: str | None = None,
    run_name: str | None = None,
    tags: Mapping[str, str] | None = None,
    span_storage: str = "artifact",
    fresh: bool = False,
) -> str:
    """Logs `timeline` as a trace of `experiment_id` linked to `run_id`, once; returns its id.

    Tags: `mlflow_neuron.run_id`, `.step`, `.device`, `.run_name`, `.cycle_key`, `.spans`,
    `.spans_dropped`, plus `tags`; the run's metric `profiler/timeline/spans` marks it complete at
    its step once everything is written. A timeline without an epoch origin (`origin_ns == 0`) is
    shifted to end now.

    `span_storage`: "artifact" (default) writes the spans as the trace's data artifact, one file;
    "tracking_store" writes them into the store's span table (searchable by span content, but a
    sqlite store takes ~0.7 ms a span: ~1.5 s for 2,000). The Traces tab draws either. `fresh`:
    no earlier attempt can have written this cycle, so no search for its earlier traces.
    """
    if span_storage not in SPAN_STORAGE:
        raise ValueError(f"span_storage must be one of {', '.join(SPAN_STORAGE)}, got {span_storage!r}")
    trace_id, written = _written_unless_complete(client, run_id, experiment_id, timeline, fresh, span_storage,
                                                 device=device, run_name=run_name, tags=tags)  # fmt: skip
    mark_complete(client, run_id, [timeline] if written else [])
    return trace_id


def log_timelines(client: Any, run_id: str, experiment_id: str, timelines: list[Timeline | TraceDraft], *, device: str | None = None,
                  run_name: str | None = None, fresh: bool = False) -> list[str]:  # fmt: skip
    """`log_timeline` for several cycles of one run: their links to the run and their marks in one
    request each."""
    marked = set() if fresh else marked_steps(client, run_id)
    done = [_written_unless_complete(client, run_id, experiment_id, timeline, fresh, "artifact", marked=marked,
                                     device=device, run_name=run_name) for timeline in timelines]  # fmt: skip
    mark_complete(client, run_id, [timeline for timeline, (_, written) in zip(timelines, done) if written])
    return [trace_id for trace_id, _ in done]


def _written_unless_complete(client: Any, run_id: str, experiment_id: str, timeline: Timeline | TraceDraft, fresh: bool,
                             span_storage: str, marked: set[int] | None = None, **tags: Any) -> tuple[str, bool]:  # fmt: skip
    """(the cycle's trace id, whether it was written now): a complete trace of the cycle is kept.
    `marked`: the run's marked steps, when the caller read them already."""
    key = cycle_key(run_id, timeline.cycle_step)
    trace_id = trace_id_for(key)
    if not fresh:
        if timeline.cycle_step in (marked_steps(client, run_id) if marked is None else marked):
            return trace_id, False
        if (done := _complete_or_cleared(client, experiment_id, key, trace_id)) is not None:
            return done, False
    _write_trace(client, run_id, experiment_id, timeline, trace_id, _trace_tags(timeline, key, run_id, **tags),
                 span_storage)  # fmt: skip
    return trace_id, True


def mark_complete(client: Any, run_id: str, timelines: list[Timeline | TraceDraft]) -> None:
    """Links the written traces of these cycles to the run (MLflow takes up to 100 a request),
    then marks them complete in one `log_batch`: only then does a later attempt take one as done."""
    trace_ids = [trace_id_for(cycle_key(run_id, t.cycle_step)) for t in timelines]
    for first in range(0, len(trace_ids), 100):
        client.link_traces_to_run(trace_ids[first : first + 100], run_id)
    now = int(time.time() * 1000)
    marks = [Metric(MARK_METRIC, float(len(t.spans)), now, t.cycle_step) for t in timelines]
    for first in range(0, len(marks), 1000):  # MLflow's limit of metrics per log_batch
        client.log_batch(run_id, metrics=marks[first : first + 1000], synchronous=True)


def marked_steps(client: Any, run_id: str) -> set[int]:
    """The steps whose cycle trace is complete (written, linked, marked)."""
    return {point.step for point in client.get_metric_history(run_id, MARK_METRIC)}


def _write_trace(client: Any, run_id: str, experiment_id: str, timeline: Timeline | TraceDraft, trace_id: str,
                 tags: dict[str, str], span_storage: str) -> None:  # fmt: skip
    """The trace's info and spans, not linked nor complete yet."""
    draft = TraceDraft.of(timeline)
    root = draft.spans[0]
    shift = 0 if draft.origin_ns else time.time_ns() - root["end_ns"]
    text = trace_data_text(draft, trace_id, shift)
    tracing = TracingClient(client.tracking_uri)
    in_store = False
    if span_storage == "tracking_store":
        try:
            tracing.log_spans(experiment_id, [Span.from_dict(d) for d in parse(text)["spans"]])
            in_store = True
        except NotImplementedError:
            pass  # stores without span logging keep the spans in an artifact (below)
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=(root["start_ns"] + shift) // 1_000_000,
        execution_duration=(root["end_ns"] - root["start_ns"]) // 1_000_000,
        state=TraceState.OK,
        trace_metadata={"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3"},
        tags=tags,
    )
    stored = tracing.start_trace(info)
    if not in_store or stored.tags.get(_SPANS_IN_STORE[0]) != _SPANS_IN_STORE[1]:
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


def _trace_tags(timeline: Timeline | TraceDraft, key: str, run_id: str, device: str | None, run_name: str | None,
                tags: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    return {
        "mlflow.traceName": timeline.name,
        CYCLE_KEY_TAG: key,
        "mlflow_neuron.run_id": run_id,
        "mlflow_neuron.step": str(timeline.cycle_step),
        "mlflow_neuron.spans": str(len(timeline.spans)),
        "mlflow_neuron.spans_dropped": str(timeline.dropped),
        **({"mlflow_neuron.device": device} if device else {}),
        **({"mlflow_neuron.run_name": run_name} if run_name else {}),
        **dict(tags or {}),
    }


@dataclass(frozen=True)
class TraceDraft:
    """What a cycle's trace is written from: a `Timeline`'s header, and its spans as the plain
    dicts of `Timeline.to_json`. The outbox's `timeline.json` is read into one without building
    2,000 span objects only to turn them into text again."""

    name: str
    cycle_step: int
    origin_ns: int
    dropped: int
    spans: list[dict]

    @classmethod
    def of(cls, timeline: Timeline | TraceDraft) -> TraceDraft:
        if isinstance(timeline, TraceDraft):
            return timeline
        spans = [{"name": s.name, "kind": s.kind, "start_ns": s.start_ns, "end_ns": s.end_ns, "parent": s.parent,
                  "attributes": s.attributes} for s in timeline.spans]  # fmt: skip
        return cls(timeline.name, timeline.cycle_step, timeline.origin_ns, timeline.dropped, spans)

    @classmethod
    def from_json(cls, text: bytes | str) -> TraceDraft:
        """ValueError (or KeyError, TypeError) for text that is not a `Timeline.to_json`."""
        data = parse(text)
        spans = data["spans"]
        if not spans or any(type(span) is not dict or span.keys() != _SPAN_KEYS for span in spans):
            raise ValueError("not a timeline: a span lacks a field, or has one of its own")
        return cls(str(data["name"]), int(data["cycle_step"]), int(data["origin_ns"]), int(data["dropped"]), spans)


_SPAN_KEYS = {"name", "kind", "start_ns", "end_ns", "parent", "attributes"}


def mlflow_spans(timeline: Timeline | TraceDraft, trace_id: str, shift_ns: int = 0) -> list[Span]:
    """The timeline's spans as MLflow `Span`s of `trace_id` (span ids: position + 1)."""
    return [Span.from_dict(d) for d in span_dicts(timeline, trace_id, shift_ns)]


def span_dicts(timeline: Timeline | TraceDraft, trace_id: str, shift_ns: int = 0) -> list[dict]:
    """The timeline's spans in the dict form `Span.from_dict` reads (attribute values JSON-encoded,
    as MLflow stores them; ids as hex)."""
    return parse(trace_data_text(TraceDraft.of(timeline), trace_id, shift_ns))["spans"]


_SPAN_TEXT = ('{"trace_id":%s,"span_id":"%016x","parent_span_id":%s,"name":%s,"start_time_unix_nano":%d,'
              '"end_time_unix_nano":%d,"status":{"code":"STATUS_CODE_OK","message":""},"attributes":{%s},"events":[]}')


def trace_data_text(draft: TraceDraft, trace_id: str, shift_ns: int = 0) -> str:
    """What MLflow's exporter uploads as a trace's data (`TraceData.to_dict()` as JSON), written
    straight from the spans: each attribute value JSON-encoded inside the JSON, as MLflow stores
    it. Text, not dicts for a JSON writer: ~16,000 values a cycle, most of them op names that
    repeat (encoded once each) and numbers.

    Column by column: the spans that share a kind and attribute names (the ops of a cycle, its
    kernels, ...) are one `%` template, filled for all of them in one pass of C; each column is
    encoded once per distinct value. A span the template cannot say exactly (the root, a column
    of mixed or odd types) is written one value at a time (`_span_text`), as it always was."""
    quoted_id = _json_string(trace_id)
    fixed = '"mlflow.traceRequestId":' + _json_string(quoted_id) + ',"mlflow.spanType":"\\"UNKNOWN\\"","kind":'
    texts: dict[str, str] = {}  # a str value -> its JSON inside JSON
    spans = draft.spans
    out: list[str | None] = [None] * len(spans)
    groups: dict[tuple, list[int]] = {}
    for i, shape in enumerate(zip(map(_KIND, spans), map(tuple, map(_ATTRIBUTES, spans)))):
        groups.setdefault(shape, []).append(i)
    head = '{"trace_id":' + quoted_id.replace("%", "%%") + ',"span_id":"%016x","parent_span_id":"%016x","name":%s,'
    for (kind, keys), rows in groups.items():
        members = [spans[i] for i in rows]
        columns = _template_columns(members, keys, texts, shift_ns)
        if columns is None:
            for i, span in zip(rows, members):
                out[i] = _span_text(span, i, quoted_id, fixed, texts, shift_ns)
            continue
        codes, values = columns
        kind_text = texts.get(kind) or texts.setdefault(kind, _json_string(_json_string(kind)))
        attributes = ",".join([(fixed + kind_text).replace("%", "%%")]
                              + [(_json_string(k) + ":").replace("%", "%%") + code for k, code in zip(keys, codes)])
        template = (head + '"start_time_unix_nano":%d,"end_time_unix_nano":%d,"status":{"code":"STATUS_CODE_OK",'
                    '"message":""},"attributes":{' + attributes + '},"events":[]}')  # fmt: skip
        ids = [i + 1 for i in rows]
        for i, text in zip(rows, map(template.__mod__, zip(ids, *values))):
            out[i] = text
    return '{"spans":[' + ",".join(out) + "]}"


_KIND, _ATTRIBUTES = itemgetter("kind"), itemgetter("attributes")
_PLACE = {int: '"%d"', float: '"%r"', str: "%s"}  # a column of one type: its value's place in the template


def _template_columns(members: list[dict], keys: tuple, texts: dict[str, str], shift_ns: int):
    """(a `%` code per attribute, the columns in template order) for spans of one shape; None when
    a template could not write them exactly as `_span_text` does."""
    parents = list(map(itemgetter("parent"), members))
    starts, ends = list(map(itemgetter("start_ns"), members)), list(map(itemgetter("end_ns"), members))
    names = list(map(itemgetter("name"), members))
    if min(parents) < 0 or {*map(type, parents), *map(type, starts), *map(type, ends)} != {int}:
        return None  # the root ("" for a parent); times that are not ints
    if set(map(type, names)) != {str}:
        return None
    codes, columns = [], []
    attributes = list(map(itemgetter("attributes"), members))
    for key in keys:
        column = list(map(itemgetter(key), attributes))
        kinds = set(map(type, column))
        if len(kinds) != 1 or (kind := kinds.pop()) not in _PLACE:
            return None
        if kind is float and not all(map(math.isfinite, column)):
            return None
        if kind is str:
            for value in set(column).difference(texts):
                texts[value] = _json_string(_json_string(value))
            column = list(map(texts.__getitem__, column))
        codes.append(_PLACE[kind])
        columns.append(column)
    named = {name: _json_string(name) for name in set(names)}
    if shift_ns:
        starts, ends = list(map(shift_ns.__add__, starts)), list(map(shift_ns.__add__, ends))
    return codes, [list(map((1).__add__, parents)), list(map(named.__getitem__, names)), starts, ends, *columns]


def _span_text(s: dict, i: int, quoted_id: str, fixed: str, texts: dict[str, str], shift_ns: int) -> str:
    """One span's text, one value at a time: any JSON value an attribute may hold."""
    kind = s["kind"]
    parts = [fixed + (texts.get(kind) or texts.setdefault(kind, _json_string(_json_string(kind))))]
    for k, v in s["attributes"].items():
        of = type(v)
        if of is str:
            text = texts.get(v)
            if text is None:
                text = texts[v] = _json_string(_json_string(v))
        elif of is int:
            text = '"' + int.__repr__(v) + '"'
        elif of is float and math.isfinite(v):
            text = '"' + float.__repr__(v) + '"'
        else:
            text = _json_string(json.dumps(v))
        parts.append(_json_string(k) + ":" + text)
    parent = s["parent"]
    return _SPAN_TEXT % (quoted_id, i + 1, f'"{parent + 1:016x}"' if parent >= 0 else '""', _json_string(s["name"]),
                         s["start_ns"] + shift_ns, s["end_ns"] + shift_ns, ",".join(parts))  # fmt: skip


_json_string = json.encoder.encode_basestring_ascii  # what json.dumps uses for a str (C when available)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
