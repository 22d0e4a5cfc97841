"""Captures on request, and the plan every rank of a job follows: their tags on the run and their
files in the node's outbox. Pure: no torch, no MLflow.

The way a capture travels (`docs/contract.md`, "Profile when it matters"):

- a **request** is the run tag `REQUEST_TAG`, set by ``mlflow-neuron capture RUN_ID`` (a JSON
  object with an id) or by hand in the MLflow UI (the number of steps; a request is new when the
  value changed);
- the node's one consumer (the helper) reads the run's tags every `POLL_S` and writes what it
  found into the run's folder in the outbox: `REQUEST_FILE`, and the latest `PLAN_FILE`;
- the job's rank 0 decides, for a request or a change of its step time, the step all ranks start
  the capture at, and writes the **plan** into its node's folder (`PLAN_FILE`, which its local ranks
  read) and on the run (`PLAN_TAG`, which the other nodes' helpers read and write into theirs);
- every training process looks at its folder once a step: one `stat`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass

REQUEST_TAG = "mlflow_neuron.capture"  # a request: {"id", "steps", "at", "by"} or, from the UI, a number of steps
PLAN_TAG = "mlflow_neuron.capture.plan"  # the latest plan of rank 0: a `Plan` as JSON (the answer to a request)
LISTEN_FILE = "capture-listen.json"  # in the run's folder: the run a helper reads the tags of
REQUEST_FILE = "capture-request.json"
PLAN_FILE = "capture-plan.json"
POLL_S = 7.0  # a helper reads each listened run's tags this often: 8.6 requests a minute (one get_run)
DEFAULT_STEPS = 5
MAX_STEPS = 1000  # a request's steps: each is profiled, and a cycle's trace is read at once
_UI_VALUE = re.compile(r"\s*(\d+)\s*(?:steps?)?\s*")


@dataclass(frozen=True)
class Request:
    id: str
    steps: int
    at: str  # when it was made (UTC, ISO 8601), or first seen by a helper
    by: str  # "capture" (the CLI) or "tag" (set by hand)


@dataclass(frozen=True)
class Plan:
    """What every rank captures: a warm-up step at `start`, then `steps` profiled steps."""

    id: str
    start: int  # the step number torch.profiler counts (`prof.step_num`), the same on every rank
    steps: int
    reason: str
    at: str
    request: str | None = None  # the id of the request it answers

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_steps(steps: object) -> int:
    """The steps of a request; ValueError saying what is allowed."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be a whole number from 1 to {MAX_STEPS}; got {steps!r}")
    return steps


def request_value(request: Request) -> str:
    """The tag's value for a request made by the CLI."""
    return json.dumps({"id": request.id, "steps": request.steps, "at": request.at, "by": request.by}, sort_keys=True)


def parse_request(value: str, seen_at: str) -> Request:
    """The request in a tag's value: the CLI's JSON, or a number of steps typed in the UI (whose id is
    the value itself: setting the same value again is not a new request). ValueError when it is
    neither, naming what is accepted."""
    match = _UI_VALUE.fullmatch(value or "")
    if match:
        return Request(id=f"tag:{value.strip()}", steps=check_steps(int(match.group(1))), at=seen_at, by="tag")
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
        raise ValueError(f"tag {REQUEST_TAG}={value[:80]!r} is not a capture request: set it to a number of "
                         f"steps (1 to {MAX_STEPS}), or use `mlflow-neuron capture RUN_ID --steps N`")  # fmt: skip
    at = data.get("at") if isinstance(data.get("at"), str) else seen_at
    return Request(id=data["id"], steps=check_steps(data.get("steps", DEFAULT_STEPS)), at=at,
                   by=str(data.get("by") or "tag"))  # fmt: skip


def parse_plan(value: str | bytes) -> Plan | None:
    """A plan as written by `Plan.to_json`; None for anything else."""
    try:
        data = json.loads(value)
        plan = Plan(**data)
    except (ValueError, TypeError):
        return None
    ok = isinstance(plan.start, int) and isinstance(plan.steps, int) and plan.steps >= 1 and isinstance(plan.id, str)
    return plan if ok else None


def request_reason(request: Request) -> str:
    """The reason a cycle of this request is recorded with."""
    clock = request.at[11:19] if len(request.at) >= 19 else request.at
    return f"requested at {clock} by `capture`" if request.by == "capture" else f"requested at {clock} by tag {REQUEST_TAG}"
