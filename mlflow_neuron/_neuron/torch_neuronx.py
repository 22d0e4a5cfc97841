"""TorchNeuron's profiling API as this package uses it: its config fields, whether it is present,
the settings a profile ran with, its profiling setup (both API generations, feature-detected), and
the instance's limits. The device-neutral part (activities, synchronize, which device) is
`_device.devices`'.
"""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path
from typing import Any

import torch

from .._trace.device_names import NEURON
from .._trace.peaks import find_peak

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

def neuron_available() -> bool:
    # TorchNeuron autoloads with torch; the import covers setups that disable autoloading.
    try:
        importlib.import_module("torch_neuronx")
    except ImportError:
        return False
    module = getattr(torch, NEURON, None)
    return module is not None and bool(getattr(module, "is_available", lambda: False)())


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


NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"


def neuron_peak(logical_cores: str) -> dict | None:
    """This EC2 instance type's line of the peaks table (per logical NeuronCore group of
    `logical_cores`, NEURON_LOGICAL_NC_CONFIG's value), or None when the type is unknown."""
    from .run_context import ec2_instance_type  # reads the DMI table: no request, no subprocess

    peak = find_peak(ec2_instance_type().get("ec2_instance_type"))
    group = int(logical_cores) if logical_cores.isdigit() and int(logical_cores) > 1 else 1
    return (peak.per_logical_core(group) if group > 1 else peak).to_dict() if peak else None


def neuron_profiling(output_dir: str | os.PathLike | None = None,
                     neff_cache_dir: str | os.PathLike | None = None) -> tuple[Any, tuple, str, Any]:  # fmt: skip
    """TorchNeuron's profiling setup: (NeuronConfig, its exporters, the output folder, None), or with
    the older context-manager API, (None, (), the output folder, its NeuronProfiler).

    PyTorch profiling copies the NEFFs into the profile folder only when a NEFF cache folder is set,
    and Explorer cannot read an NTFF without its NEFF: `neff_cache_dir` is passed as given, else
    `TORCH_NEURONX_NEFF_CACHE_DIR`'s, else `<output_dir>_neff_cache` (beside the output folder, so
    the cache is not uploaded as cycle output). The undocumented `correlate_device_time=True` is
    passed only where accepted.
    """
    profiling = importlib.import_module("torch_neuronx.profiling")
    out = os.fspath(output_dir or Path.cwd() / "neuron_profile")
    NeuronProfiler = profiling.NeuronProfiler
    if not hasattr(profiling, "NeuronConfig") and "neuron_output_dir" in _parameters(NeuronProfiler):
        return None, (), out, NeuronProfiler(neuron_output_dir=out)
    NeuronConfig, ProfileMode = profiling.NeuronConfig, profiling.ProfileMode
    kwargs: dict[str, Any] = {"modes": [ProfileMode.DEVICE, ProfileMode.RUNTIME], "profile_output_dir": out}
    accepted = _parameters(NeuronConfig)
    if "neff_cache_dir" in accepted:
        cache = neff_cache_dir or os.environ.get(NEFF_CACHE_ENV, "").strip() or os.path.normpath(out) + "_neff_cache"
        kwargs["neff_cache_dir"] = os.fspath(cache)
    if "correlate_device_time" in accepted:
        kwargs["correlate_device_time"] = True
    config = NeuronConfig(**kwargs)
    return config, (NeuronProfiler(config).export_trace,), out, None


def _parameters(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


