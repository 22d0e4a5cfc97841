"""Everything that differs between Neuron, CUDA and CPU lives here, and the device names that
traces made elsewhere are tagged with (ROCm, XPU, MTIA: ingest only).

The rest of the package asks this module which device a profiler recorded, how to read device
time from a torch event, how to synchronize, and what the Neuron profiler writes to disk. No other
module compares device names.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import inspect
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

NEURON = "neuron"
CUDA = "cuda"
CPU = "cpu"
# Only read from traces made elsewhere (ingest): the device tag of an AMD GPU, Intel GPU, Meta MTIA.
ROCM = "rocm"
XPU = "xpu"
MTIA = "mtia"

# Device rows of key_averages(); compared as enum members because a PrivateUse1 rename changes
# their printed names ("NEURON") but not their identity.
DEVICE_ROW_TYPES = frozenset(
    getattr(DeviceType, name)
    for name in ("CUDA", "PrivateUse1", "MTIA", "HPU", "XPU")
    if hasattr(DeviceType, name)
)

# Documented NeuronConfig fields (Neuron 2.31-2.33); anything else is read only if present.
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

# How NeuronProfiler names the framework trace: export_trace in a session folder, and the older
# context-manager profiler as `pytorch_trace.json` in its `neuron_output_dir`.
NEURON_FRAMEWORK_TRACE_PATTERNS = ("trace.json", "neuron_framework_trace_rank_*.json", "pytorch_trace.json")

# `<instance-id>_pid_<pid>` is the per-process folder of the Neuron output layout.
_PROCESS_FOLDER = re.compile(r"_pid_(\d+)$")

MISSING_DEVICE_TIME_HINT = (
    "device activity was profiled but no op carried device time. Usual causes: the step does not "
    "wait for the device before prof.step() (call torch.{device}.synchronize()), or the backend "
    "reports only runtime/driver events (early TorchNeuron builds). Per-op metrics fall back to "
    "self CPU time."
)


def backend_name_of_privateuse1() -> str:
    return torch._C._get_privateuse1_backend_name()


def profiled_device(prof: Any) -> str:
    """The device whose activity `prof` records: "neuron", "cuda", another backend, or "cpu"."""
    use_device = getattr(prof, "use_device", None)
    if use_device:
        return str(use_device)
    activities = set(getattr(prof, "activities", ()) or ())
    if ProfilerActivity.CUDA in activities:
        return CUDA
    if ProfilerActivity.PrivateUse1 in activities:
        return backend_name_of_privateuse1()
    return CPU


def activity_names(prof: Any) -> list[str]:
    """Activity names as the user thinks of them ("cpu", "neuron"), sorted."""
    names = []
    for activity in getattr(prof, "activities", ()) or ():
        if activity == ProfilerActivity.PrivateUse1:
            names.append(backend_name_of_privateuse1())
        else:
            names.append(activity.name.lower())
    return sorted(names)


def is_device_row(event: Any) -> bool:
    return event.device_type in DEVICE_ROW_TYPES


def self_device_time_us(event: Any) -> float:
    """Self device time of a torch event; very old torch only had the CUDA-named attribute."""
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0)
    return float(value or 0)


def device_time_us(event: Any) -> float:
    value = getattr(event, "device_time_total", None)
    if value is None:
        value = getattr(event, "cuda_time_total", 0)
    return float(value or 0)


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


def process_of(relative_path: str) -> int | None:
    """The pid a Neuron output file belongs to, from its `<instance>_pid_<pid>` folder."""
    first = relative_path.replace("\\", "/").split("/", 1)[0]
    match = _PROCESS_FOLDER.search(first)
    return int(match.group(1)) if match else None


def is_framework_trace(relative_path: str) -> bool:
    name = relative_path.replace("\\", "/").rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) for p in NEURON_FRAMEWORK_TRACE_PATTERNS)


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


def profiling_setup(device: str, output_dir: str | os.PathLike | None = None) -> ProfilingSetup:
    """Activities, Neuron config and exporter for `device`.

    On Neuron this builds `NeuronConfig(modes=[DEVICE, RUNTIME])` and its `NeuronProfiler`
    exporter; the undocumented `correlate_device_time=True` is passed only where accepted. An
    older TorchNeuron without `NeuronConfig`, whose `NeuronProfiler` takes `neuron_output_dir`,
    gets that profiler as `neuron_context` instead.
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
    if "correlate_device_time" in _parameters(NeuronConfig):
        kwargs["correlate_device_time"] = True
    config = NeuronConfig(**kwargs)
    return ProfilingSetup(device, activities, config, (NeuronProfiler(config).export_trace,), out)


def _parameters(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


# Chrome-trace categories of device activity, and of host-side runtime/driver calls to a device.
# ROCm traces file HIP calls as cuda_runtime (torch's Kineto build maps roctracer onto the CUDA
# activity types); hip_* is accepted too.
DEVICE_TRACE_CATEGORIES = frozenset({
    "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "cuda_profiler_range",
    "mtia_ccp_events", "mtia_insight", "mtia_counters", "hpu_op",
})  # fmt: skip
_RUNTIME_DEVICE = {
    "mtia_runtime": MTIA,
    "xpu_runtime": XPU, "xpu_driver": XPU,
    "privateuse1_runtime": NEURON, "privateuse1_driver": NEURON,
    "hip_runtime": ROCM, "hip_driver": ROCM,
    "cuda_runtime": CUDA, "cuda_driver": CUDA,
}  # fmt: skip  # first match wins
RUNTIME_TRACE_CATEGORIES = frozenset(_RUNTIME_DEVICE)
_ROCM_TRACE_KEYS = ("roctracer_version", "hip_runtime_version", "hip_driver_version")


def device_of_trace(trace: dict) -> tuple[str, bool]:
    """(device, device activity profiled) of a chrome trace, from what it holds.

    Devices: "cuda", "rocm" (AMD GPUs: HIP calls, roctracer metadata or an AMD device in
    `deviceProperties`), "xpu", "mtia", "neuron" (PrivateUse1 activity is taken to be TorchNeuron's,
    the backend this package is for; so are device events with no runtime calls and no
    `deviceProperties`), or "cpu" when the trace holds no device or runtime event. A trace with device
    events is always profiled: when no op carries their time the state is "missing", never
    "not_profiled".
    """
    events = [e for e in trace.get("traceEvents", ()) if isinstance(e, dict)]
    categories = {e.get("cat") for e in events}
    if not categories & (DEVICE_TRACE_CATEGORIES | RUNTIME_TRACE_CATEGORIES):
        return CPU, False
    if categories & {"mtia_ccp_events", "mtia_insight", "mtia_counters"}:
        return MTIA, True
    device = next((d for c, d in _RUNTIME_DEVICE.items() if c in categories), None)
    if device in (CUDA, None) and _is_rocm(trace, events):
        return ROCM, True
    if device is None:
        return (CUDA if trace.get("deviceProperties") else NEURON), True
    return device, True


def _is_rocm(trace: dict, events: list) -> bool:
    if any(k in trace for k in _ROCM_TRACE_KEYS):
        return True
    properties = trace.get("deviceProperties")
    if isinstance(properties, list) and any(
        isinstance(p, dict) and re.search(r"\b(AMD|Radeon|Instinct)\b", str(p.get("name", ""))) for p in properties
    ):
        return True
    calls = (e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    return any(str(e.get("name", "")).startswith("hip") for e in calls)


# neuron-explorer replaced neuron-profile (same sub-commands); either may be on PATH.
NEURON_SUMMARY_TOOLS = ("neuron-explorer", "neuron-profile")
NEURON_TOOLS_DIR = "/opt/aws/neuron/bin"
NEURON_SUMMARY_PREFIX = "neuron/summary"


def neuron_summary_tool() -> str | None:
    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), NEURON_TOOLS_DIR) if p)
    for name in NEURON_SUMMARY_TOOLS:
        found = shutil.which(name, path=search)
        if found:
            return found
    return None


def is_neuron_session(folder_files: list[str]) -> bool:
    """A capture session folder: it holds a device trace or its executable."""
    return any(name.endswith((".ntff", ".neff")) for name in folder_files)


# A device trace is readable only with the NEFF it was captured from. Their names share a hash:
# `neff_<hash>[_vnc_<n>].neff` pairs with `<hash>_instid_<i>_vnc_<n>.ntff`. Session traces named
# `profile_nc_<N>_session_<M>.ntff` carry no hash: they pair with the session's only NEFF.
_NEFF_HASH = re.compile(r"^neff_([0-9A-Za-z]+?)(?:_vnc_\d+)?\.neff$")
_NTFF_HASH = re.compile(r"^([0-9A-Za-z]+)_instid_\d+_vnc_\d+\.ntff$")
NEURON_VIEW_TOOL = NEURON_SUMMARY_TOOLS[0]


def ntff_pairs(relative_paths: list[str]) -> dict[str, str | None]:
    """{ntff: the NEFF it pairs with, or None when no NEFF of its folder can be told to be it}."""
    by_folder: dict[str, list[str]] = {}
    for path in relative_paths:
        folder, _, name = path.replace("\\", "/").rpartition("/")
        by_folder.setdefault(folder, []).append(name)
    pairs: dict[str, str | None] = {}
    for folder, names in by_folder.items():
        neffs = {m.group(1): n for n in names if (m := _NEFF_HASH.match(n))}
        all_neffs = sorted(n for n in names if n.endswith(".neff"))
        for name in sorted(n for n in names if n.endswith(".ntff")):
            match = _NTFF_HASH.match(name)
            if match:
                neff = neffs.get(match.group(1))
            else:
                neff = all_neffs[0] if len(all_neffs) == 1 else None
            pairs[_join(folder, name)] = _join(folder, neff) if neff else None
    return pairs


def view_pair_command(neff: str, ntff: str, tool: str = NEURON_VIEW_TOOL) -> list[str]:
    return [tool, "view", "-n", neff, "-s", ntff]


def view_session_command(session_dir: str, tool: str = NEURON_VIEW_TOOL) -> list[str]:
    return [tool, "view", "-d", session_dir]


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name
