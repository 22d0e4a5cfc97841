"""The profiling settings of a run, read off a `torch.profiler.profile` object (pure)."""

from __future__ import annotations

from typing import Any

from .._neuron import devices as _devices

_SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")
_PROFILER_FLAGS = (
    "record_shapes",
    "with_stack",
    "profile_memory",
    "with_flops",
    "with_modules",
    "acc_events",
)


def schedule_of(prof: Any) -> dict[str, int] | None:
    """wait/warmup/active/repeat of a `torch.profiler.schedule(...)`; None without a schedule.

    torch keeps them only as the closure of the schedule function, so they are read from there;
    a user-written schedule function yields None.
    """
    fn = getattr(prof, "schedule", None)
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None or len(code.co_freevars) != len(cells):
        return None
    values = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
    if not {"wait", "warmup", "active"} <= values.keys():
        return None
    return {field: int(values[field]) for field in _SCHEDULE_FIELDS if field in values}


def profiling_params(prof: Any, *, device: str, output_dir: str | None) -> dict[str, str]:
    """Run params that describe how the profile was taken."""
    params = {
        "profiler.device": device,
        "profiler.activities": ",".join(_devices.activity_names(prof)),
    }
    schedule = schedule_of(prof)
    if schedule is None:
        params["profiler.schedule"] = "custom" if _has_custom_schedule(prof) else "none"
    else:
        params.update({f"profiler.schedule.{k}": str(v) for k, v in schedule.items()})
    for flag in _PROFILER_FLAGS:
        if hasattr(prof, flag):
            params[f"profiler.{flag}"] = str(bool(getattr(prof, flag)))
    if output_dir:
        params["profiler.output_dir"] = str(output_dir)
    neuron = _devices.neuron_settings(getattr(prof, "experimental_config", None))
    params.update({f"neuron.{k}": v for k, v in neuron.items()})
    params.update({f"versions.{k}": v for k, v in _devices.package_versions().items()})
    return params


def _has_custom_schedule(prof: Any) -> bool:
    fn = getattr(prof, "schedule", None)
    return fn is not None and getattr(fn, "__name__", "") != "_default_schedule_fn"
