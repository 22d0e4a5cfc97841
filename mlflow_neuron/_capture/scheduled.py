"""Profiling a framework's training steps with torch.profiler into one MLflow run.

Framework-neutral core of `mlflow_neuron.lightning` and `mlflow_neuron.transformers`: each
framework callback says when a training step ends and which run and device to use.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerAction, profile, schedule

from .callback import MLflowProfilerCallback
from .distributed import primary_run
from .._device.devices import profiling_setup, synchronize
from .._delivery.report import Reporter


class ScheduledProfiler:
    """``torch.profiler`` over a framework's training steps, logging into one MLflow run.

    Framework-neutral: the framework callback says when training steps end and which run and
    device to use. Every method is guarded: trouble becomes one warning (or, strict, an error).
    """

    def __init__(
        self, *, wait: int, warmup: int, active: int, repeat: int, skip_first: int, device: str | None,
        profile_output_dir: str | os.PathLike | None, record_shapes: bool, profile_memory: bool,
        with_stack: bool, handlers: Any, run_id: str | None, tracking_uri: str | None, options: dict[str, Any],
    ) -> None:  # fmt: skip
        self.schedule = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "active": active, "repeat": repeat}
        for name, value in self.schedule.items():
            smallest = 1 if name == "active" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
                raise ValueError(
                    f"{name} must be an int >= {smallest}; got {value!r} (schedule: skip_first >= 0, wait >= 0, "
                    "warmup >= 0, active >= 1, repeat >= 0 where 0 means every cycle until training ends)"
                )
        if device is not None and not isinstance(device, str):
            raise TypeError(f"device must be a device type such as 'neuron', 'cuda' or 'cpu'; got {device!r}")
        if profile_output_dir is not None and not isinstance(profile_output_dir, (str, os.PathLike)):
            raise TypeError(f"profile_output_dir must be a path or None; got {profile_output_dir!r}")
        self.handlers = tuple(handlers)
        for handler in self.handlers:
            if not callable(handler):
                raise TypeError(f"handlers must be callables taking the profiler; got {handler!r}")
        accepted = set(inspect.signature(MLflowProfilerCallback.__init__).parameters) - _NOT_OPTIONS
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)}; options go to MLflowProfilerCallback, "
                f"which takes: {', '.join(sorted(accepted))}"
            )
        self.device = device
        self.profile_output_dir = profile_output_dir
        self.profiler_flags = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.options = options
        self.reporter = Reporter(options.get("strict"))
        self.callback: MLflowProfilerCallback | None = None
        self.steps = 0
        self._prof: Any = None
        self._device = "cpu"
        self._done = False

    @property
    def waiting_to_start(self) -> bool:
        return self._prof is None and not self._done

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(self, device: str, run: Callable[[], tuple[str | None, str | None]]) -> None:
        """Starts profiling on `device` (unless given one) into `run()`'s (run id, tracking URI)."""
        self._guarded("start", self._start, device, run)

    def step(self) -> None:
        """Ends a profiler step; stops the profiler once the schedule's last cycle is logged."""
        self._guarded("step", self._step)

    def stop(self) -> None:
        self._guarded("stop", self._stop)

    def reset(self) -> None:
        """Lets a later training run (`trainer.fit`/`train` again) profile once more."""
        self.stop()
        self._done = False

    def _start(self, device: str, run: Callable[[], tuple[str | None, str | None]]) -> None:
        self._device = self.device or device
        run_id, tracking_uri = self.run_id, self.tracking_uri
        if run_id is None:
            # The framework's logger has its run on rank 0 only: every rank takes rank 0's
            # (one broadcast, at the first step, as in the callback's constructor).
            run_id, found_uri = primary_run(*run())
            tracking_uri = tracking_uri or found_uri
        setup = profiling_setup(self._device, self.profile_output_dir)
        self.callback = MLflowProfilerCallback(
            *setup.handlers, *self.handlers, run_id=run_id, tracking_uri=tracking_uri,
            profile_output_dir=setup.output_dir, **self.options,
        )  # fmt: skip
        self.steps = 0
        self._prof = profile(
            **setup.profiler_kwargs(), **self.profiler_flags,
            schedule=schedule(**self.schedule), on_trace_ready=self.callback,
        )  # fmt: skip
        self._prof.start()

    def _step(self) -> None:
        if self._prof is None:
            return
        synchronize(self._device)
        self._prof.step()
        self.steps += 1
        s = self.schedule
        if s["repeat"] and self.steps == s["skip_first"] + s["repeat"] * (s["wait"] + s["warmup"] + s["active"]):
            self._stop()  # every cycle is logged: train on without the profiler's overhead

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        self._done = True
        if not _recording_holds_a_step(prof):
            prof.on_trace_ready = None  # it would log only what ran after the last training step
        try:
            synchronize(self._device)
            prof.stop()
        finally:
            self.callback.close()
        if self.callback.cycles_read == 0:
            s = self.schedule
            self.reporter.problem(
                "no_cycle",
                f"training ended after {self.steps} profiled step(s), before the first profiler cycle was "
                f"complete (skip_first + wait + warmup = {s['skip_first'] + s['wait'] + s['warmup']} steps, "
                "then the active ones); nothing was logged",
            )

    def _guarded(self, what: str, fn: Callable, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - profiling never stops training
            prof, self._prof, self._done = self._prof, None, True
            try:
                if prof is not None:
                    prof.stop()  # no profiler left running after an error
            except Exception:  # noqa: BLE001 - the error being reported is the one that matters
                pass
            self.reporter.problem(what, f"the profiler could not {what}; training goes on without it", error)


def _recording_holds_a_step(prof: Any) -> bool:
    """Whether the cycle that `prof.stop()` would close holds at least one whole training step.

    Stopping in an active window hands its recording to `on_trace_ready`. If the window began
    with the last `step()`, that recording holds no training step, only what ran after it.
    """
    return prof.step_num > 0 and prof.schedule(prof.step_num - 1) == ProfilerAction.RECORD


# Set by the framework callback or taken from the framework, never passed through as options.
_NOT_OPTIONS = frozenset({"self", "handlers", "run_id", "tracking_uri", "profile_output_dir"})


class ProfiledTraining:
    """What the framework callbacks share: their arguments (the schedule, the profiler's flags, the
    run, and `MLflowProfilerCallback`'s options) and the callback of the current training run."""

    def __init__(
        self,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        device: str | None = None,
        profile_output_dir: str | os.PathLike | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        handlers: tuple = (),
        run_id: str | None = None,
        tracking_uri: str | None = None,
        **options: Any,
    ) -> None:
        self.profiler = ScheduledProfiler(
            wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first, device=device,
            profile_output_dir=profile_output_dir, record_shapes=record_shapes, profile_memory=profile_memory,
            with_stack=with_stack, handlers=handlers, run_id=run_id, tracking_uri=tracking_uri, options=options,
        )  # fmt: skip

    @property
    def callback(self) -> MLflowProfilerCallback | None:
        """The `MLflowProfilerCallback` of the current (or last) training run; None before it."""
        return self.profiler.callback
