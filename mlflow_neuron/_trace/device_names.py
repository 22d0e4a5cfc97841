"""Device names, and which device made a saved trace: the part of device knowledge a trace reader
needs, without torch.

`mlflow_neuron.device` tags say "neuron", "cuda" or "cpu" for live profiles; traces made elsewhere
(ingest) can also say "rocm", "xpu" or "mtia".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

NEURON = "neuron"
CUDA = "cuda"
CPU = "cpu"
# Only read from traces made elsewhere (ingest): the device tag of an AMD GPU, Intel GPU, Meta MTIA.
ROCM = "rocm"
XPU = "xpu"
MTIA = "mtia"


MISSING_DEVICE_TIME_HINT = (
    "device activity was profiled but no op carried device time. Usual causes: the step does not "
    "wait for the device before prof.step() (call torch.{device}.synchronize()), or the backend "
    "reports only runtime/driver events (early TorchNeuron builds). Per-op metrics fall back to "
    "self CPU time."
)

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


def device_of_trace(trace: Mapping) -> tuple[str, bool]:
    """`device_of` a chrome trace in memory."""
    events = [e for e in trace.get("traceEvents", ()) if isinstance(e, dict)]
    hip_calls = any(e.get("cat") in ("cuda_runtime", "cuda_driver") and str(e.get("name", "")).startswith("hip")
                    for e in events)  # fmt: skip
    return device_of({e.get("cat") for e in events}, trace, hip_calls)


def device_of(categories: set, header: Mapping, hip_calls: bool) -> tuple[str, bool]:
    """(device, device activity profiled) of a chrome trace, from the categories of its events,
    its other keys (`header`) and whether it holds HIP calls.

    Devices: "cuda", "rocm" (AMD GPUs: HIP calls, roctracer metadata or an AMD device in
    `deviceProperties`), "xpu", "mtia", "neuron" (PrivateUse1 activity is taken to be TorchNeuron's,
    the backend this package is for; so are device events with no runtime calls and no
    `deviceProperties`), or "cpu" when the trace holds no device or runtime event. A trace with device
    events is always profiled: when no op carries their time the state is "missing", never
    "not_profiled".
    """
    if not categories & (DEVICE_TRACE_CATEGORIES | RUNTIME_TRACE_CATEGORIES):
        return CPU, False
    if categories & {"mtia_ccp_events", "mtia_insight", "mtia_counters"}:
        return MTIA, True
    device = next((d for c, d in _RUNTIME_DEVICE.items() if c in categories), None)
    if device in (CUDA, None) and (hip_calls or _is_rocm(header)):
        return ROCM, True
    if device is None:
        return (CUDA if header.get("deviceProperties") else NEURON), True
    return device, True


def _is_rocm(header: Mapping) -> bool:
    if any(k in header for k in _ROCM_TRACE_KEYS):
        return True
    properties = header.get("deviceProperties")
    return isinstance(properties, list) and any(
        isinstance(p, dict) and re.search(r"\b(AMD|Radeon|Instinct)\b", str(p.get("name", ""))) for p in properties
    )
