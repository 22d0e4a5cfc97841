"""`interleaved`: profile variants of some code in rotation, one cycle each, one run per variant.

Profiled one after another (all of naive, then all of fused), any drift in the host's load lands
on one variant and reads as a difference between them. In rotation (naive, fused, compiled,
naive, fused, ...) drift falls on every variant alike, and it shows as a difference between one
variant's cycles, which the comparison then treats as the unit of replication (`_analysis.cycles`).
This is for comparing code; a training job keeps one profile and one callback.
"""

from __future__ import annotations

import contextlib
import gc
import os
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient
from mlflow.tracking.context import registry as context_tags
from torch.profiler import profile, schedule

from .._record.model import ROTATION_TAG
from ..exceptions import MLflowNeuronWarning, strict_from_env
from .._device.devices import ProfilingSetup, pick_device, profiling_setup, synchronize
from .callback import MLflowProfilerCallback

PARENT_TAG = "mlflow.parentRunId"


@dataclass(frozen=True)
class InterleavedRuns:
    """What `interleaved` profiled: each variant's run, the variants that raised, and the order."""

    run_ids: dict[str, str]  # every variant's run, in the order the variants were given
    failed: dict[str, str] = field(default_factory=dict)  # variant -> "ValueError: ..." (its run is FAILED)
    order: tuple[tuple[int, str], ...] = ()  # (cycle, variant), in the order they were profiled


def interleaved(
    variants: Mapping[str, Callable[[], Any]],
    cycles: int = 4,
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 5,
    device: str | None = None,
    setup: Callable[[str], ProfilingSetup] | None = None,
    profile_dir: str | os.PathLike = "neuron_profile",
    parent_run_id: str | None = None,
    experiment_id: str | None = None,
    tracking_uri: str | None = None,
    pause_gc: bool = True,
    strict: bool | None = None,
    profile_kwargs: Mapping[str, Any] | None = None,
    **callback_kwargs: Any,
) -> InterleavedRuns:
    """Profiles each variant for `cycles` cycles, in rotation, into one MLflow run per variant.

    Example::

        with mlflow.start_run(run_name="rmsnorm"):
            runs = interleaved({"naive": lambda: naive(x, w), "fused": lambda: fused(x, w)}, cycles=4)
        compare_runs(list(runs.run_ids.values()), baseline="naive")

    `variants` maps a name (its run's name, a child of `parent_run_id`, default the active run)
    to a callable that runs one step. A cycle is `wait + warmup + active` steps of one variant,
    each followed by the device's synchronize, in a profile of its own; it is logged at the step
    one profile with `repeat=cycles` would log it at. Four or more cycles let the comparison
    check the cycles against each other. `setup` gives each variant's `ProfilingSetup`
    (default `profiling_setup(device, <profile_dir>/<name>)`: Neuron files stay apart).
    `pause_gc` collects before each cycle and pauses Python's collector during it (as `timeit`);
    `profile_kwargs` go to each `torch.profiler.profile` (``record_shapes=True``, ...).
    A variant that raises ends FAILED with one warning, and the others go on; `strict` (default:
    env ``MLFLOW_NEURON_STRICT``) raises at once. `callback_kwargs` go to each variant's
    `MLflowProfilerCallback` (``background=False``, ``log_timeline=False``, ...).
    """
    _check(variants, cycles, wait, warmup, active)
    device = device or pick_device()
    setups = {name: (setup or _default_setup(device, profile_dir))(name) for name in variants}
    client = MlflowClient(tracking_uri)
    run_ids = _create_runs(client, list(variants), parent_run_id, experiment_id)
    callbacks = {name: MLflowProfilerCallback(*setups[name].handlers, run_id=run_ids[name], tracking_uri=tracking_uri,
                                              profile_output_dir=setups[name].output_dir, **callback_kwargs)
                 for name in variants}  # fmt: skip
    rotation = _Rotation(device, (wait, warmup, active), pause_gc, strict_from_env() if strict is None else strict,
                         dict(profile_kwargs or {}))  # fmt: skip
    try:
        for cycle in range(cycles):
            for name, step in variants.items():
                if name not in rotation.failed:
                    rotation.run(name, step, callbacks[name], setups[name], cycle, run_ids[name])
    finally:
        _close(client, callbacks, run_ids, rotation.failed)
    if len(rotation.failed) == len(variants):
        raise RuntimeError(f"every variant raised: {rotation.failed}")
    return InterleavedRuns(run_ids, rotation.failed, tuple(rotation.order))


def _close(client: MlflowClient, callbacks: dict, run_ids: dict, failed: dict) -> None:
    """Closes each variant's callback (the runs are compared next): each delivers what is left within
    its `flush_timeout_s`, from this process too, and says what it kept. Then ends each run."""
    for name, callback in callbacks.items():
        callback.close(callback.flush_timeout_s)
        client.set_terminated(run_ids[name], "FAILED" if name in failed else "FINISHED")


@dataclass
class _Rotation:
    """How each cycle is profiled, and what happened so far."""

    device: str
    window: tuple[int, int, int]  # wait, warmup, active
    pause_gc: bool
    strict: bool
    profile_kwargs: dict
    failed: dict[str, str] = field(default_factory=dict)
    order: list[tuple[int, str]] = field(default_factory=list)

    def run(self, name: str, step: Callable[[], Any], callback: MLflowProfilerCallback, setup: ProfilingSetup,
            cycle: int, run_id: str) -> None:  # fmt: skip
        self.order.append((cycle, name))
        try:
            _one_cycle(step, callback, setup, self.device, cycle, self.window, self.pause_gc, self.profile_kwargs)
        except Exception as error:
            self.failed[name] = f"{type(error).__name__}: {error}"
            if self.strict:
                raise
            warnings.warn(f"variant {name!r} raised {self.failed[name]} in its cycle {cycle + 1}; its run {run_id} "
                          "ends FAILED and the other variants go on", MLflowNeuronWarning, stacklevel=4)  # fmt: skip


def _one_cycle(step: Callable[[], Any], callback: MLflowProfilerCallback, setup: ProfilingSetup, device: str,
               cycle: int, window: tuple[int, int, int], pause_gc: bool, profile_kwargs: dict) -> None:  # fmt: skip
    """One profiled cycle of one variant, logged at the step its `cycle` has in the rotation."""
    wait, warmup, active = window
    length = wait + warmup + active
    earlier = cycle * length  # the steps this variant's earlier cycles took
    plan = schedule(skip_first=earlier, wait=wait, warmup=warmup, active=active, repeat=1)
    with setup.context(), _gc_paused(pause_gc):
        callback.mark_window_start()
        with profile(**{**setup.profiler_kwargs(), **profile_kwargs}, schedule=plan, on_trace_ready=callback) as prof:
            for _ in range(earlier):  # steps of the schedule's skip_first: nothing is recorded
                prof.step()
            for _ in range(length):
                step()
                synchronize(device)
                prof.step()


@contextlib.contextmanager
def _gc_paused(pause: bool):
    if not pause:
        yield
        return
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _create_runs(client: MlflowClient, names: list[str], parent_run_id: str | None,
                 experiment_id: str | None) -> dict[str, str]:  # fmt: skip
    """One run per variant, created together, with the tags `mlflow.start_run` would give them and
    one `ROTATION_TAG` for all: `compare` reads it to know that their cycles alternated."""
    if parent_run_id is None and mlflow.active_run() is not None:
        parent_run_id = mlflow.active_run().info.run_id
    if experiment_id is None:
        experiment_id = (client.get_run(parent_run_id).info.experiment_id if parent_run_id
                         else mlflow.tracking.fluent._get_experiment_id() or "0")  # fmt: skip
    tags = {ROTATION_TAG: uuid.uuid4().hex, **({PARENT_TAG: parent_run_id} if parent_run_id else {})}
    return {name: client.create_run(experiment_id, run_name=name, tags=context_tags.resolve_tags(tags)).info.run_id
            for name in names}  # fmt: skip


def _default_setup(device: str, profile_dir: str | os.PathLike) -> Callable[[str], ProfilingSetup]:
    return lambda name: profiling_setup(device, os.path.join(os.fspath(profile_dir), name))


def _check(variants: Mapping, cycles: int, wait: int, warmup: int, active: int) -> None:
    if not variants or not isinstance(variants, Mapping):
        raise ValueError(f"variants must be a non-empty mapping of name -> step callable; got {variants!r}")
    for name, step in variants.items():
        if not callable(step):
            raise TypeError(f"variant {name!r} must be a callable that runs one step; got {step!r}")
    for label, value, least in (("cycles", cycles, 1), ("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{label} must be an int >= {least}; got {value!r}")
