"""What differs between Neuron, CUDA and CPU for a live profiler: which device a profiler records,
its activities, how to wait for the device, which device to run on, and TorchNeuron's profiling
setup (both API generations, feature-detected).

Where the Neuron profiler writes is `layout`'s; which device a saved trace came from is
`_trace.device_names`'.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from .._trace.device_names import CPU, CUDA, NEURON
from .._trace.kineto import privateuse1_backend_name
from .._trace.peaks import LNC_ENV, PEAKS_ENV, find_peak, load_peak

# Documented NeuronConfig fields (Neuron 2.31-2.34); anything else is read only if present.
NEURON_CONFIG_FIELDS = (
    "modes",
    "max_events_per_nc",
    "capture_enabled_for_nc",
    "profile_output_dir",
    "neff_cache_dir",
    "precache_node_info",
)

# Fields of the older, context-manager NeuronProfiler(pytorch_activities=..., neuron_output_dir=...),
# seen in public torch-neuronx code; read only where present.
OLDER_NEURON_PROFILER_FIELDS = (
    "neuron_output_dir",
    "pytorch_activities",
    "pytorch_trace_file",
    "record_shapes",
    "event_filters",
)

def profiled_device(prof: Any) -> str:
    """The device whose activity `prof` records: "neuron", "cuda", another backend, or "cpu"."""
    use_device = getattr(prof, "use_device", None)
    if use_device:
        return str(use_device)
    activities = set(getattr(prof, "activities", ()) or ())
    if ProfilerActivity.CUDA in activities:
        return CUDA
    if ProfilerActivity.PrivateUse1 in activities:
        return privateuse1_backend_name()
    return CPU


def device_peak(device: str) -> dict | None:
    """The limits of the device profiled (`_trace.peaks`): the user's file (MLFLOW_NEURON_PEAKS),
    else the table's line for this EC2 instance type (Neuron) or GPU name; None when unknown (CPU).
    Raises ValueError for a peaks file that cannot be read."""
    override = os.environ.get(PEAKS_ENV, "").strip()
    if override:
        return load_peak(override).to_dict()
    return _table_peak(device, os.environ.get(LNC_ENV, "").strip())


@functools.lru_cache(maxsize=8)
def _table_peak(device: str, logical_cores: str) -> dict | None:
    if device == NEURON:
        from .run_context import ec2_instance_type  # reads the DMI table: no request, no subprocess

        peak = find_peak(ec2_instance_type().get("ec2_instance_type"))
        group = int(logical_cores) if logical_cores.isdigit() and int(logical_cores) > 1 else 1
        return (peak.per_logical_core(group) if group > 1 else peak).to_dict() if peak else None
    if device == CUDA and torch.cuda.is_available():
        peak = find_peak(torch.cuda.get_device_name(torch.cuda.current_device()))
        return peak.to_dict() if peak else None
    return None


def activity_names(prof: Any) -> list[str]:
    """Activity names as the user thinks of them ("cpu", "neuron"), sorted."""
    names = []
    for activity in getattr(prof, "activities", ()) or ():
        if activity == ProfilerActivity.PrivateUse1:
            names.append(privateuse1_backend_name())
        else:
            names.append(activity.name.lower())
    return sorted(names)


def profiler_activities(device: str) -> list[ProfilerActivity]:
    """Activities that record `device` together with the host."""
    if device == CPU:
        return [ProfilerActivity.CPU]
    if device == CUDA:
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    return [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def synchronize(device: str) -> None:
    """Wait for queued device work, so its time lands in this step's profile."""
    if device == CPU:
        return
    module = getattr(torch, device, None)
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def neuron_available() -> bool:
    # TorchNeuron autoloads with torch; the import covers setups that disable autoloading.
    try:
        importlib.import_module("torch_neuronx")
    except ImportError:
        return False
    module = getattr(torch, NEURON, None)
    return module is not None and bool(getattr(module, "is_available", lambda: False)())


def pick_device(requested: str | None = None) -> str:
    """The device to run on: `requested`, else Neuron, then CUDA, then CPU.

    Raises ValueError, with one line that says why, for a device this machine does not have.
    """
    if requested:
        available = {NEURON: neuron_available, CUDA: torch.cuda.is_available, CPU: lambda: True}
        if requested not in available:
            raise ValueError(f"unknown device {requested!r}; expected one of {', '.join(available)}")
        if not available[requested]():
            why = ("torch_neuronx is not installed or sees no NeuronCore" if requested == NEURON
                   else "torch.cuda.is_available() is False")  # fmt: skip
            raise ValueError(f"device {requested!r} is not available on this machine ({why}); "
                             f"leave the device out to pick the best one present")  # fmt: skip
        return requested
    if neuron_available():
        return NEURON
    if torch.cuda.is_available():
        return CUDA
    return CPU


def neuron_settings(experimental_config: Any) -> dict[str, str]:
    """Neuron profiling settings carried by a profiler's `experimental_config`.

    Reads a NeuronConfig's documented attributes, the `key:value;...` string that earlier
    TorchNeuron builds passed as `_ExperimentalConfig(custom_profiler_config=...)`, or the settings
    of the older context-manager `NeuronProfiler(pytorch_activities=..., neuron_output_dir=...)`.
    """
    if experimental_config is None:
        return {}
    settings = {}
    for field in NEURON_CONFIG_FIELDS + OLDER_NEURON_PROFILER_FIELDS:
        value = getattr(experimental_config, field, None)
        if value is not None:
            settings[field] = _setting_text(value)
    custom = getattr(experimental_config, "custom_profiler_config", "") or ""
    if isinstance(custom, str):
        for item in custom.split(";"):
            key, sep, value = item.partition(":")
            if sep and key.strip() and key.strip() not in settings:
                settings[key.strip()] = value.strip()
    return settings


def _setting_text(value: Any) -> str:
    if isinstance(value, dict):
        return ";".join(f"{k}:{_setting_text(v)}" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(sorted(_setting_text(item) for item in value))
    return str(getattr(value, "name", value))


def package_versions() -> dict[str, str]:
    """Versions of the stack a profile was taken with; absent packages are left out."""
    versions = {"torch": torch.__version__}
    for package in ("torch-neuronx", "neuronx-cc", "mlflow", "mlflow-neuron"):
        try:
            versions[package.replace("-", "_")] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def compile_backend(device: str) -> str:
    """The torch.compile backend for `device` (TorchNeuron registers "neuron")."""
    return NEURON if device == NEURON else "inductor"


@dataclass(frozen=True)
class ProfilingSetup:
    """The torch.profiler arguments that record `device`, and the handlers it needs.

    With the older, context-manager TorchNeuron API, `neuron_context` is its `NeuronProfiler`
    (runtime capture only; torch.profiler stays yours): enter `setup.context()` around the
    profiled loop and pass `profile_output_dir=setup.output_dir` to the callback.
    """

    device: str
    activities: list
    experimental_config: Any = None
    handlers: tuple = ()
    output_dir: str | None = None
    neuron_context: Any = None

    def context(self) -> Any:
        """The older API's runtime-capture context manager, or one that does nothing."""
        import contextlib

        return self.neuron_context if self.neuron_context is not None else contextlib.nullcontext()

    def profiler_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"activities": self.activities}
        if self.experimental_config is not None:
            kwargs["experimental_config"] = self.experimental_config
        return kwargs


NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"


def profiling_setup(device: str, output_dir: str | os.PathLike | None = None,
                    neff_cache_dir: str | os.PathLike | None = None) -> ProfilingSetup:  # fmt: skip
    """Activities, Neuron config and exporter for `device`.

    On Neuron this builds `NeuronConfig(modes=[DEVICE, RUNTIME])` and its `NeuronProfiler`
    exporter. PyTorch profiling copies the NEFFs into the profile folder only when a NEFF cache
    folder is set, and Explorer cannot read an NTFF without its NEFF: `neff_cache_dir` is passed
    as given, else `TORCH_NEURONX_NEFF_CACHE_DIR`'s, else `<output_dir>_neff_cache` (beside the
    output folder, so the cache is not uploaded as cycle output). The undocumented
    `correlate_device_time=True` is passed only where accepted. An older TorchNeuron without
    `NeuronConfig`, whose `NeuronProfiler` takes `neuron_output_dir`, gets that profiler as
    `neuron_context` instead.
    """
    activities = profiler_activities(device)
    if device != NEURON:
        return ProfilingSetup(device, activities)
    profiling = importlib.import_module("torch_neuronx.profiling")
    out = os.fspath(output_dir or Path.cwd() / "neuron_profile")
    NeuronProfiler = profiling.NeuronProfiler
    if not hasattr(profiling, "NeuronConfig") and "neuron_output_dir" in _parameters(NeuronProfiler):
        return ProfilingSetup(device, activities, output_dir=out, neuron_context=NeuronProfiler(neuron_output_dir=out))
    NeuronConfig, ProfileMode = profiling.NeuronConfig, profiling.ProfileMode
    kwargs: dict[str, Any] = {"modes": [ProfileMode.DEVICE, ProfileMode.RUNTIME], "profile_output_dir": out}
    accepted = _parameters(NeuronConfig)
    if "neff_cache_dir" in accepted:
        cache = neff_cache_dir or os.environ.get(NEFF_CACHE_ENV, "").strip() or os.path.normpath(out) + "_neff_cache"
        kwargs["neff_cache_dir"] = os.fspath(cache)
    if "correlate_device_time" in accepted:
        kwargs["correlate_device_time"] = True
    config = NeuronConfig(**kwargs)
    return ProfilingSetup(device, activities, config, (NeuronProfiler(config).export_trace,), out)


def _parameters(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


