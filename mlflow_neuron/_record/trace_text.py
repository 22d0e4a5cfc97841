"""A cycle's trace data as MLflow stores it (`TraceData.to_dict()` as JSON), written from its
`Timeline` without MLflow: the helper writes it while it prepares a cycle, before it has imported
MLflow (about 2 s of a core), so that sending the cycle is only MLflow's requests.

The text is written under a stand-in trace id (`TraceText`): a cycle's trace id comes from its
run's id, which a run the callback creates gets only when it is created, at the first delivery.
The stand-in is `tr-` and 32 random hex digits, as a real id is; JSON encoding leaves both as
they are, so replacing one with the other gives the text that `trace_data_text` would write for
the real id, byte for byte.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from .._trace.json_text import parse
from .._trace.timeline import Timeline


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
        return cls(timeline.name, timeline.cycle_step, timeline.origin_ns, timeline.dropped, timeline.span_dicts())

    @classmethod
    def from_json(cls, text: bytes | str) -> TraceDraft:
        """ValueError (or KeyError, TypeError) for text that is not a `Timeline.to_json`."""
        data = parse(text)
        spans = data["spans"]
        if not spans or any(type(span) is not dict or span.keys() != _SPAN_KEYS for span in spans):
            raise ValueError("not a timeline: a span lacks a field, or has one of its own")
        return cls(str(data["name"]), int(data["cycle_step"]), int(data["origin_ns"]), int(data["dropped"]), spans)


_SPAN_KEYS = {"name", "kind", "start_ns", "end_ns", "parent", "attributes"}


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


@dataclass(frozen=True)
class TraceText:
    """A cycle's trace data under a stand-in trace id, with what its trace info and tags take
    from the timeline. Only for a timeline with an epoch origin (one without is shifted to end
    at the time it is sent)."""

    name: str
    cycle_step: int
    origin_ns: int
    dropped: int
    span_count: int
    start_ns: int  # the root span's
    end_ns: int
    stand_in: str
    text: str

    @classmethod
    def of(cls, draft: TraceDraft) -> TraceText:
        if not draft.origin_ns:
            raise ValueError("a timeline without an epoch origin is shifted when it is sent: no text ahead")
        stand_in, root = "tr-" + uuid.uuid4().hex, draft.spans[0]
        return cls(draft.name, draft.cycle_step, draft.origin_ns, draft.dropped, len(draft.spans), root["start_ns"],
                   root["end_ns"], stand_in, trace_data_text(draft, stand_in))  # fmt: skip

    def file_text(self) -> str:
        """One line of header (JSON), then the text."""
        header = {k: getattr(self, k) for k in _HEADER}
        return json.dumps(header) + "\n" + self.text

    @classmethod
    def from_file_text(cls, text: str) -> TraceText:
        """ValueError (or KeyError, TypeError) for text `file_text` did not write."""
        header, _, body = text.partition("\n")
        data = json.loads(header)
        if not isinstance(data, dict) or data.keys() != set(_HEADER) or not body.startswith('{"spans":['):
            raise ValueError("not a cycle's trace text")
        return cls(text=body, **data)

    def for_trace(self, trace_id: str) -> str:
        """The text for the cycle's real trace id."""
        return self.text.replace(self.stand_in, trace_id)


_HEADER = ("name", "cycle_step", "origin_ns", "dropped", "span_count", "start_ns", "end_ns", "stand_in")


def span_count(timeline: Timeline | TraceDraft | TraceText) -> int:
    return timeline.span_count if isinstance(timeline, TraceText) else len(timeline.spans)
