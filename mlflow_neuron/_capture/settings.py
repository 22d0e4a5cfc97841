"""The profiling settings of a run, read off a `torch.profiler.profile` object (pure)."""

from __future__ import annotations

from typing import Any

from .._device.devices import activity_names, package_versions
from .._neuron.torch_neuronx import neuron_settings
from .._trace.kineto import schedule_of

_PROFILER_FLAGS = (
    "record_shapes",
    "with_stack",
    "profile_memory",
    "with_flops",
    "with_modules",
    "acc_events",
)


def profiling_params(prof: Any, *, device: str, output_dir: str | None) -> dict[str, str]:
    """Run params that describe how the profile was taken."""
    params = {
        "profiler.device": device,
        "profiler.activities": ",".join(activity_names(prof)),
    }
    schedule = schedule_of(prof)
    own = getattr(getattr(prof, "schedule", None), "params", None)  # the callback's own (`adaptive`)
    if schedule is None and callable(own):
        params.update(own())
    elif schedule is None:
        params["profiler.schedule"] = "custom" if _has_custom_schedule(prof) else "none"
    else:
        params.update({f"profiler.schedule.{k}": str(v) for k, v in schedule.items()})
    for flag in _PROFILER_FLAGS:
        if hasattr(prof, flag):
            params[f"profiler.{flag}"] = str(bool(getattr(prof, flag)))
    if output_dir:
        params["profiler.output_dir"] = str(output_dir)
    neuron = neuron_settings(getattr(prof, "experimental_config", None))
    params.update({f"neuron.{k}": v for k, v in neuron.items()})
    params.update({f"versions.{k}": v for k, v in package_versions().items()})
    return params


def _has_custom_schedule(prof: Any) -> bool:
    fn = getattr(prof, "schedule", None)
    return fn is not None and getattr(fn, "__name__", "") != "_default_schedule_fn"
