"""What the rank summary makes of an event by its category and name: HolisticTraceAnalysis's
kernel classes, each category's role, and the names that mark a step or a collective. Pure."""

from __future__ import annotations

import re

# HolisticTraceAnalysis's kernel classes (hta/common/types.py), first match wins: communication,
# memory, compute (whatever the last pattern does not match), other.
COMM_KERNEL = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
MEMORY_KERNEL = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
NOT_COMPUTE_KERNEL = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)|(^runFunction)"
    r"|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)|(^collective_subgraph_execution)"
)
DEVICE_CATEGORY = re.compile(r"(.*kernel)|(^gpu_mem)|(^mtia_ccp_events)|(^cuda_sync)")
HOST_DEVICE_COPY = re.compile(r"^(hip)?Memcpy|^dma")
_CPU_OPS = ("cpu_op", "Operator")
COMPUTE, COMM, MEMORY, OTHER = 0, 1, 2, 3
CPU_OP, DEVICE, LAUNCH, ANNOTATION, SKIP = range(5)  # what an event's category makes it here


def kernel_class(name: str) -> int:
    """HTA's class of a device event by its name: COMM, MEMORY, COMPUTE or OTHER."""
    if COMM_KERNEL.match(name):
        return COMM
    if MEMORY_KERNEL.match(name):
        return MEMORY
    return OTHER if NOT_COMPUTE_KERNEL.match(name) else COMPUTE


def device_class(category: str, name: str) -> tuple[int, bool]:
    """A device event's HTA class, and whether the rank summary keeps its args (a collective's
    kernel, or a copy between host and device)."""
    kind = MEMORY if category.startswith("gpu_mem") else kernel_class(name)
    return kind, kind == COMM or (kind == MEMORY and bool(HOST_DEVICE_COPY.match(name)))


PLAIN, MARKED, CALL = 0, 1, 2  # a name: nothing special; a step or a backend span; a c10d call or record_param_comms


def name_flag(name: str) -> int:
    """What `collectives.RankEvents.feed` does with an event of this name beyond its category's role."""
    if name.startswith(("ProfilerStep#", "gloo:", "nccl:")):
        return MARKED
    return CALL if name.startswith("c10d::") or name == "record_param_comms" else PLAIN


def role_of(category: str) -> int:
    if category in _CPU_OPS:
        return CPU_OP
    if DEVICE_CATEGORY.match(category):
        return DEVICE
    if category.endswith(("_runtime", "_driver")):
        return LAUNCH
    return SKIP if category.startswith("gpu_") or category == "python_function" else ANNOTATION
