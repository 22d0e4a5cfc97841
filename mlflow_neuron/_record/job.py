"""`CycleJob`: one profiler cycle as the training thread hands it over, before anything is read.

It names where the cycle's numbers come from (`source`: anything with `summarize()`), the files
to upload and where they go, the run's settings for this cycle, and the host's numbers during
its window (sampled on the training thread, plain data). Nothing in it is written yet:
`prepare.Preparer` turns it into a `Delivery` off the training thread. A job whose source is a
saved trace (`ChromeTraceFile`) is plain data and travels to the helper process as a message.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._trace.summarize import ChromeTraceFile, CycleSettings
from .model import Delivery, cycle_dir
from .keys import NEURON_SUMMARY_PREFIX


@dataclass
class CycleJob:
    step: int
    timestamp_ms: int
    artifact_dir: str  # "profiler/step_<N>" (rank 0) or "profiler/step_<N>/rank_<r>"
    staged_dir: Path  # where the generated files are written; removed once delivered or stored
    source: Any = None  # `.summarize()` gives the cycle's numbers; None: this rank logs no metrics
    params: dict[str, str] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    uploads: tuple[tuple[str, str], ...] = ()  # (local file, artifact folder): the profiler's own files
    register_table: bool = False  # show ops.json as a table in the UI (rank 0)
    raw_trace: Path | None = None  # uncompressed framework trace, gzipped into staged_dir
    trace_export: Callable[[Path], None] | None = None  # writes raw_trace first (in-process jobs only)
    summary_tool: str | None = None  # neuron-explorer, to summarize the cycle's capture sessions
    summary_sessions: tuple[str, ...] = ()
    summary_prefix: str = NEURON_SUMMARY_PREFIX
    tags: dict[str, str] = field(default_factory=dict)  # besides the device tags
    table_note: str = ""  # a first line for key_averages.txt
    host: dict[str, float] = field(default_factory=dict)  # the host during the window (model.HOST_VALUES)
    peak: dict | None = None  # the device's limits (`_trace.peaks.Peak.to_dict()`): ops.json's % of peak
    # {"rank", "world_size", "host", "trace"}: write the cycle's rank summary (`RANK_SUMMARY`) from
    # its trace ("trace": a Neuron session's framework trace; None: `raw_trace`); None: none
    rank_summary: dict | None = None
    upload_trace: bool = True  # False: the trace serves the rank summary only, and is not uploaded
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, message), reported once sent
    delivery: Delivery | None = field(default=None, repr=False)  # set once prepared
    record: Path | None = field(default=None, repr=False)  # its outbox record, once written ahead of delivery
    unwritable: bool = field(default=False, repr=False)  # writing it ahead failed: not tried again before storing
    tried: bool = False  # a delivery of it was attempted (maybe in another process): it may be partly written
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def portable(self) -> bool:
        """Whether the job can go to another process: its source is a file, or there is none."""
        return (self.source is None or isinstance(self.source, ChromeTraceFile)) and self.trace_export is None

    def to_message(self) -> dict:
        """The job as JSON-able data for the helper process (`from_message` reads it back)."""
        if not self.portable:
            raise ValueError(f"the job of step {self.step} holds in-process objects and cannot be sent")
        message = {k: v for k, v in _fields(self).items() if k not in _LOCAL}
        message.update(staged_dir=str(self.staged_dir), raw_trace=str(self.raw_trace) if self.raw_trace else None,
                       source=asdict(self.source) if self.source is not None else None)  # fmt: skip
        return message

    @classmethod
    def from_message(cls, message: dict) -> CycleJob:
        data = dict(message)
        source = data.pop("source", None)
        if source is not None:
            settings = dict(source["settings"])
            if settings.get("timeline_step") is not None:  # a job queued before the root's name travelled with it
                settings.setdefault("timeline_root", cycle_dir(settings["timeline_step"]))
            source = ChromeTraceFile(source["path"], CycleSettings(**settings), source.get("fallback"))
        data.update(staged_dir=Path(data["staged_dir"]), raw_trace=Path(data["raw_trace"]) if data.get("raw_trace")
                    else None, uploads=tuple(tuple(u) for u in data.get("uploads", ())),
                    summary_sessions=tuple(data.get("summary_sessions", ())))  # fmt: skip
        return cls(source=source, **data)


    def to_entry(self, entry: Path) -> dict:
        """`to_message` with the paths inside the outbox entry `entry` relative to it (an outbox may
        be read later from another mount point, or another container)."""
        message = self.to_message()
        _map_paths(message, lambda p: os.path.relpath(p, entry) if _inside(p, entry) else p)
        return message

    @classmethod
    def from_entry(cls, message: dict, entry: Path) -> CycleJob:
        message = json.loads(json.dumps(message))  # a copy: the paths are rewritten
        _map_paths(message, lambda p: p if os.path.isabs(p) else str(entry / p))
        return cls.from_message(message)


def _inside(path: str, folder: Path) -> bool:
    return os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)


def _map_paths(message: dict, change) -> None:
    for name in ("staged_dir", "raw_trace"):
        if message.get(name):
            message[name] = change(message[name])
    source = message.get("source")
    if isinstance(source, dict):
        for name in ("path", "fallback"):
            if source.get(name):
                source[name] = change(source[name])


_LOCAL = ("trace_export", "problems", "delivery", "record", "unwritable", "lock", "source", "staged_dir", "raw_trace")


def _fields(job: CycleJob) -> dict:
    return {name: getattr(job, name) for name in job.__dataclass_fields__}
