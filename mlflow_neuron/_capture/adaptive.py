"""`AdaptiveSchedule`: the callback's own torch.profiler schedule, which profiles when it matters.

    callback = MLflowProfilerCallback()
    with profile(activities=..., schedule=callback.schedule(), on_trace_ready=callback) as prof:

torch calls a schedule once per `prof.step()` with the step number (and once, with 0, when the
profile is made) and does what the returned `ProfilerAction` says. This one

- captures a **baseline** once, after `warmup_steps`;
- times every step in between, as the time between two calls: between captures nothing else runs
  there. The step after a capture (the cycle is read in it) and the steps a capture profiles are
  not timed;
- captures again when the step time **changed** (`step_times.ShiftRule`: a sustained shift of the
  median of recent steps, not one slow step), at most `max_captures_per_hour`;
- logs the step times between captures as `profiler/step_time_ms` (`step_times.StepTimeLine`)
  through the outbox, and each spike at its step as `profiler/step_time_spike_ms`;
- captures on request (`mlflow-neuron capture`, or the run tag set by hand), which the node's
  helper hands to it through the run's folder in the outbox (`plans`);
- in a job of several ranks, lets rank 0 alone decide: its `Plan` names a step a few steps ahead
  that every rank starts the capture at (`_record.capture_request` tells how a plan travels);
- says why it captured each cycle (`Capture.reason`), which the callback writes into the cycle's
  manifest.json and a run tag (`describe_cycle`).

A capture is one warm-up step, then `active_steps` profiled steps (6 by default: enough for
`mlflow-neuron ranks` to name a straggler). Bad options raise at construction; inside the loop the
schedule reports trouble through the callback's reporter (one warning; strict mode raises).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from torch.profiler import ProfilerAction

from .._delivery.node_parts import run_folder
from .._delivery.records import queue_record
from .._record.capture_request import PLAN_TAG, Plan, Request, now_iso, request_reason
from .._record.model import CAPTURE_REASON_TAG, PROFILER_FOLDER, Delivery
from .plans import Plans
from .step_times import ShiftRule, StepTimeLine

# name: (default, smallest allowed, what it is)
OPTIONS: dict[str, tuple[Any, float, str]] = {
    "warmup_steps": (20, 0, "steps before the baseline capture (compilation, caches, the first batches)"),
    "active_steps": (6, 1, "profiled steps of each capture, after one warm-up step"),
    "max_captures_per_hour": (6, 1, "captures in any hour, the baseline included"),
    # 0.25: beside busy processes a 20 ms sleep can wake a scheduler tick late for good (24 ms, +20%)
    "min_change": (0.25, 0.01, "the smallest change of the step time that is captured, as a fraction (0.25: 25%)"),
    "window_steps": (20, 5, "recent steps whose median is compared with the level"),
    "persist_steps": (5, 1, "steps in a row (and 0.2 s at least) the change must hold before it is captured"),
    "metric_steps": (50, 1, "steps in each point of profiler/step_time_ms (a point covers 1 s at least)"),
}
# The step-time points go to the outbox at most this often (and at each capture, and at close): a
# delivery is 2 requests (the server's probe, `log_batch`); with the helper's reads of capture
# requests (8.6 a minute), at most 12 requests a minute per node while idle (benchmarks/capture_requests.py).
FLUSH_S = 60.0
HOUR_S = 3600.0
FOLLOW_STEPS = 3  # a plan starts this many steps ahead at least where other ranks follow it
LOOK_NS = 5_000_000  # each rank looks at the run's folder (one stat) at the first step after this long
MAX_AHEAD_STEPS = 100_000
# Where rank 0's plan reaches other nodes through the run's tags: its record's delivery, then each
# node helper's next read (`capture_request.POLL_S`), with room to spare.
NODES_LEAD_S = 15.0
_NONE = ProfilerAction.NONE


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Every option, defaults filled in; ValueError naming what is allowed for a bad one."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"callback.schedule() has no option {', '.join(map(repr, unknown))}; it takes "
                         + "; ".join(f"{name} (default {d}: {what})" for name, (d, _, what) in OPTIONS.items()))
    checked = {}
    for name, (default, least, what) in OPTIONS.items():
        value = options.get(name, default)
        kind = float if isinstance(default, float) else int
        allowed_types = (int, float) if kind is float else int
        if isinstance(value, bool) or not isinstance(value, allowed_types) or not value >= least:  # NaN is not >= least
            allowed = f"a number >= {least}" if kind is float else f"an int >= {least}"
            raise ValueError(f"callback.schedule(): {name} must be {allowed} (default {default}: {what}); "
                             f"got {value!r}")  # fmt: skip
        checked[name] = kind(value)
    return checked


@dataclass
class Capture:
    """One capture of the schedule: why, its warm-up step and last profiled step, and when (UTC)."""

    reason: str
    first_step: int  # the warm-up step; the profiled steps follow it
    last_step: int
    at: str


class AdaptiveSchedule:
    """A torch.profiler schedule (step -> `ProfilerAction`) that captures a baseline, then each
    change of the step time and each request; made by ``MLflowProfilerCallback.schedule(**options)``
    (`OPTIONS`). In a job of several ranks, rank 0 (`leader`) decides and writes a `Plan` that the
    others follow (`plans`), `lead_s` ahead (at least `FOLLOW_STEPS` steps)."""

    def __init__(self, reporter: Any, send: Callable[[Delivery], Any] | None, *,
                 clock: Callable[[], int] = time.perf_counter_ns, plans: Plans | None = None,
                 leader: bool = True, followers: bool = False, lead_s: float = 0.0, **options: Any) -> None:  # fmt: skip
        self.options = check_options(options)
        self.reporter, self.send, self.clock, self.plans = reporter, send, clock, plans
        self.leader, self.followers, self.lead_s = leader, followers, lead_s
        o = self.options
        self.rule = ShiftRule(window=o["window_steps"], persist=o["persist_steps"], min_change=o["min_change"])
        self.line = StepTimeLine(lambda points: send(_points(points)), every=o["metric_steps"], flush_s=FLUSH_S,
                                 clock=lambda: self.clock() / 1e9) if send is not None else None  # fmt: skip
        self.captures: list[Capture] = []
        self.spikes: deque[tuple[int, float]] = deque(maxlen=100)  # (step, ms) of the latest spikes
        self.missed = 0  # changes not captured: the hour's captures were spent
        self.pending: Plan | None = None  # the next capture planned (rank 0's, or one it sent)
        self._request: Request | None = None  # a request seen, not planned yet (rank 0)
        self._answered: set[str] = set()  # requests planned already (rank 0)
        self._followed = -1  # the start of the latest plan taken
        self._starts: deque[int] = deque()  # when each capture of the last hour began (`clock`)
        self._calls = 0
        self._capture_call: int | None = None  # the call of the capture in progress's warm-up step
        self._active = o["active_steps"]  # profiled steps of the capture in progress
        self._last: tuple[int, int] | None = None  # (step, `clock`) of the latest call
        self._recent_ns: deque[int] = deque(maxlen=9)  # the latest steps timed: a plan's lead in steps
        self._quiet = 0  # NONE actions in a row up to the latest call, since the profile was made
        self._looked = -LOOK_NS  # `clock` of the latest look at the run's folder
        self._shift = None  # the change the latest step time made sustained, for this call to act on
        if plans is not None:  # a plan or request older than this process is not for it
            old = plans.plan()
            self._followed = old.start if old is not None and not leader else -1
            self._answered.update([old.request] if old is not None and old.request else [])

    def __call__(self, step: int) -> ProfilerAction:
        now = self.clock()
        try:
            return self._next(step, now)
        except Exception as error:  # noqa: BLE001 - never into prof.step(); strict mode raises
            self.reporter.problem("schedule", f"callback.schedule() failed at step {step!r}", error)
            return self._planned() or _NONE

    def params(self) -> dict[str, str]:
        """The run params that describe it (`settings.profiling_params`)."""
        return {"profiler.schedule": "callback.schedule()",
                **{f"profiler.schedule.{name}": str(value) for name, value in self.options.items()}}  # fmt: skip

    def capture_of(self, step: int) -> Capture | None:
        """The capture a cycle read at `step` comes from: the latest one begun before it."""
        latest = self.captures[-1] if self.captures else None
        return latest if latest is not None and latest.first_step < step else None

    def close(self) -> None:
        """Sends the step times not sent yet (the callback's close)."""
        if self.line is not None:
            self.line.close_point()
            self.line.flush()

    def _next(self, step: int, now: int) -> ProfilerAction:
        last, self._last = self._last, (step, now)
        restarted = last is None or step != last[0] + 1  # a new profile: nothing before this call counts
        if restarted:
            self._quiet = 0
            if self._capture_call is not None:  # the old profile's stop() ended it
                self._capture_call = None
                self.rule.reset()
        elif self._quiet >= 2:  # the last step and the one before it unprofiled: nothing but the step ran
            self._timed(last[0], now - last[1])
        if self.plans is not None and now - self._looked >= LOOK_NS:  # a stat costs 2-7 us here: not on each fast step
            self._looked = now
            if self.plans.changed():
                self._look(step)
        action = (self._capture_call is not None and self._planned()) or self._decide(step)
        self._quiet = self._quiet + 1 if action is _NONE else 0
        self._calls += 1
        return action

    def _timed(self, step: int, ns: int) -> None:
        """The time of `step`, which ran unprofiled after an unprofiled step."""
        self._recent_ns.append(ns)
        if not self.leader and self.line is None:
            return  # a follower decides nothing and sends no line
        spike = self.rule.is_spike(ns)
        if spike:
            self.spikes.append((step, round(ns / 1e6, 3)))
        if self.line is not None:
            self.line.add(step, ns, spike)
        if self.captures and self.leader:  # the level is measured after the baseline
            self._shift = self.rule.add(step, ns)

    def _look(self, step: int) -> None:
        """What is new in the run's folder: rank 0 takes a request; the others, rank 0's plans."""
        if self.leader:
            request = self.plans.request()
            if request is not None and request.id not in self._answered:
                self._request = request
            return
        plan = self.plans.plan()
        if plan is None or plan.start <= self._followed:
            return
        self._followed = plan.start
        if plan.start < step:
            self.reporter.problem("capture_late", f"the capture planned by rank 0 for step {plan.start} was seen "
                                  f"at step {step}: this rank's cycle begins there, later than rank 0's")  # fmt: skip
        self.pending = plan

    def _planned(self) -> ProfilerAction | None:
        """The action of a capture in progress at this call, or None (ends it after its last step)."""
        if self._capture_call is None:
            return None
        offset = self._calls - self._capture_call
        active = self._active
        if offset <= active:
            return (ProfilerAction.WARMUP if offset == 0 else ProfilerAction.RECORD if offset < active
                    else ProfilerAction.RECORD_AND_SAVE)  # fmt: skip
        self._capture_call = None
        self.rule.reset()  # the level after a capture is measured again: one change, one capture
        return None

    def _decide(self, step: int) -> ProfilerAction:
        shift, self._shift = self._shift, None
        if not self.captures and self._calls >= self.options["warmup_steps"]:
            return self._begin(step, "baseline", self.options["active_steps"])  # every rank: the same call
        if self.leader and self.pending is None and self._request is not None:
            request, self._request = self._request, None
            self._answered.add(request.id)
            self._plan(step, request_reason(request), request.steps, request.id)
        elif self.leader and self.pending is None and shift is not None and self._allowed(shift):
            self._plan(step, shift.reason(), self.options["active_steps"], None)
        if self.pending is not None and step >= self.pending.start:
            plan, self.pending = self.pending, None
            return self._begin(step, plan.reason, plan.steps)
        return _NONE

    def _plan(self, step: int, reason: str, steps: int, request: str | None) -> None:
        """Rank 0's capture: now where no other rank follows, else a few steps (`lead_s`) ahead,
        written for its node's ranks and, on the run, for every node's (the answer to a request)."""
        ahead = 0
        if self.followers:
            lead_ns = self.lead_s * 1e9 + 2 * LOOK_NS  # the other ranks look at most each LOOK_NS
            step_ns = sorted(self._recent_ns)[len(self._recent_ns) // 2] if self._recent_ns else 0  # one short step is not the pace
            ahead = max(FOLLOW_STEPS, math.ceil(lead_ns / step_ns) if step_ns else FOLLOW_STEPS)
        plan = Plan(id=uuid.uuid4().hex[:12], start=step + min(ahead, MAX_AHEAD_STEPS), steps=steps, reason=reason,
                    at=now_iso(), request=request)  # fmt: skip
        self.pending = plan
        if self.plans is not None and self.followers:
            self.plans.write(plan)
        if self.send is not None:
            self.send(_record(step, tags={PLAN_TAG: plan.to_json()}))

    def _allowed(self, shift: Any) -> bool:
        now = self.clock()
        while self._starts and now - self._starts[0] >= HOUR_S * 1e9:
            self._starts.popleft()
        if len(self._starts) < self.options["max_captures_per_hour"]:
            return True
        self.missed += 1
        self.rule.reset()
        limit = self.options["max_captures_per_hour"]
        self.reporter.problem("schedule_limit", f"{shift.reason()} was not captured: {limit} capture(s) in the "
                              f"last hour already (max_captures_per_hour={limit})")  # fmt: skip
        return False

    def _begin(self, step: int, reason: str, steps: int) -> ProfilerAction:
        self._starts.append(self.clock())
        self.captures.append(Capture(reason, step, step + steps, now_iso()))
        self._capture_call, self._active = self._calls, steps
        if self.line is not None:  # the line is current when a capture comes; no point spans a capture
            self.line.close_point()
            self.line.flush()
        return ProfilerAction.WARMUP


def describe_cycle(job: Any, prof: Any, schedule: AdaptiveSchedule | None, primary: bool) -> None:
    """Writes why the cycle was captured into its manifest.json (and, rank 0, a run tag), where
    the profile runs on the callback's own schedule."""
    if schedule is None or getattr(prof, "schedule", None) is not schedule:
        return
    capture = schedule.capture_of(job.step)
    if capture is not None:  # a profile stopped during a capture ends it at its step
        job.manifest["capture"] = {**asdict(capture), "last_step": min(capture.last_step, job.step)}
        if primary:
            job.tags[CAPTURE_REASON_TAG.format(step=job.step)] = capture.reason


def _points(points: list[tuple[str, float, int]]) -> Delivery:
    """Step-time points as a delivery of metrics alone: no files, no cycle."""
    return _record(max(step for _, _, step in points), series=tuple(points))


def _record(step: int, **fields: Any) -> Delivery:
    """A delivery of the schedule's own at `step` (its step times, a plan): no files, no cycle."""
    return Delivery(step=step, timestamp_ms=int(time.time() * 1000), artifact_dir=PROFILER_FOLDER, **fields)


def attach(callback: Any, options: dict[str, Any]) -> AdaptiveSchedule:
    """`MLflowProfilerCallback.schedule`: the schedule, reading its run's folder in the outbox
    (requests; rank 0's plans) and, on rank 0, sending its step times and plans through the outbox."""
    check_options(options)  # a bad option raises before anything is written
    producer, rank = callback._producer, callback.rank
    send = (lambda delivery: queue_record(producer, delivery, f"the schedule's record of step {delivery.step}")
            if rank.is_primary else None)  # fmt: skip
    plans = None
    try:
        plans = Plans(run_folder(producer.outbox, producer.parts_area), producer.run)
    except OSError as error:  # no requests nor plans then; the schedule's own captures go on
        callback.reporter.problem("schedule", "callback.schedule() cannot use its folder in the outbox: it "
                                  "captures no request, and other ranks do not follow rank 0", error)  # fmt: skip
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    nodes = rank.world_size > int(local) if local.isdigit() and int(local) > 0 else False
    schedule = AdaptiveSchedule(callback.reporter, send, plans=plans, leader=rank.is_primary,
                                followers=rank.world_size > 1, lead_s=NODES_LEAD_S if nodes else 0.0, **options)  # fmt: skip
    callback._reader.schedule = schedule
    return schedule
