"""What differs between Neuron, CUDA and CPU for a live profiler: which device a profiler records,
its activities, how to wait for the device, which device to run on, its limits, and the profiling
setup for each. No `if device == ...` elsewhere.

TorchNeuron's own part (its config fields, both API generations, feature-detected) is
`_neuron.torch_neuronx`'; where the Neuron profiler writes is `_neuron.layout`'s; which device a
saved trace came from is `_trace.device_names`'.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from .._neuron.torch_neuronx import neuron_available, neuron_peak, neuron_profiling
from .._trace.device_names import CPU, CUDA, NEURON
from .._trace.kineto import privateuse1_backend_name
from .._trace.peaks import LNC_ENV, PEAKS_ENV, find_peak, load_peak

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
        return neuron_peak(logical_cores)
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


def profiling_setup(device: str, output_dir: str | os.PathLike | None = None,
                    neff_cache_dir: str | os.PathLike | None = None) -> ProfilingSetup:  # fmt: skip
    """Activities, Neuron config and exporter for `device`.

    On Neuron this builds `NeuronConfig(modes=[DEVICE, RUNTIME])` and its `NeuronProfiler`
    exporter (`_neuron.torch_neuronx.neuron_profiling`: where the NEFFs go, and what is
    feature-detected). An older TorchNeuron without `NeuronConfig`, whose `NeuronProfiler` takes
    `neuron_output_dir`, gets that profiler as `neuron_context` instead.
    """
    activities = profiler_activities(device)
    if device != NEURON:
        return ProfilingSetup(device, activities)
    config, handlers, out, context = neuron_profiling(output_dir, neff_cache_dir)
    if context is not None:
        return ProfilingSetup(device, activities, output_dir=out, neuron_context=context)
    return ProfilingSetup(device, activities, config, handlers, out)
