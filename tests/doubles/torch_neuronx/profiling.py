"""Test double of `torch_neuronx.profiling`, written to the documented API (Neuron 2.31-2.34).

`NeuronConfig` is a real `_ExperimentalConfig` (torch accepts nothing else as
`experimental_config`), and `NeuronProfiler.export_trace` writes the documented session layout:

    <profile_output_dir>/<instance-id>_pid_<pid>/<timestamp>/
        trace.json  ntrace.pb  trace_info.pb  cpu_util.pb  host_mem.pb
        neff_<hash>_vnc_0.neff  profile_nc_<N>_session_<M>.ntff

As documented, the NEFFs are copied into the session only when `neff_cache_dir` (or
`TORCH_NEURONX_NEFF_CACHE_DIR`) is set; the NTFFs are written either way. `ProfileMode.RUNTIME`
alone gives a system-only session (`ntrace.pb` + `trace_info.pb`).

The contents are stand-in bytes, not real NEFF/NTFF data. Knobs for tests are module attributes.
"""

from __future__ import annotations

import enum
import itertools
import os
import time
from pathlib import Path

from torch._C._profiler import _ExperimentalConfig

INSTANCE_ID = "i-0fa1ce0000000test"
# Test knobs: sizes of the stand-in device files, the framework trace's name, NeuronCores used.
NTFF_BYTES = 4096
NEFF_BYTES = 2048
FRAMEWORK_TRACE_NAME = "trace.json"  # some versions: "neuron_framework_trace_rank_<N>.json"
ACTIVE_CORES = (0,)
CORES = (0, 1)

_sessions = itertools.count()


class ProfileMode(enum.Enum):
    DEVICE = "device"  # .neff + .ntff
    RUNTIME = "runtime"  # trace_info.pb + ntrace.pb
    CPU_UTIL = "cpu_util"  # cpu_util.pb
    HOST_MEMORY = "host_memory"  # host_mem.pb


class NeuronConfig(_ExperimentalConfig):
    def __init__(
        self,
        modes=None,
        max_events_per_nc: int = 1_000_000,
        capture_enabled_for_nc: str | None = None,
        profile_output_dir: str | None = None,
        neff_cache_dir: str | None = None,
        precache_node_info: bool = True,
    ) -> None:
        super().__init__()
        self.modes = list(modes) if modes is not None else [ProfileMode.DEVICE, ProfileMode.RUNTIME]
        self.max_events_per_nc = max_events_per_nc
        self.capture_enabled_for_nc = capture_enabled_for_nc
        self.profile_output_dir = profile_output_dir or os.path.join(os.getcwd(), "neuron_profile")
        self.neff_cache_dir = neff_cache_dir or os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
        self.precache_node_info = precache_node_info


class NeuronProfiler:
    def __init__(self, config: NeuronConfig) -> None:
        self.config = config
        self.sessions: list[Path] = []

    def export_trace(self, prof) -> None:
        session = (
            Path(self.config.profile_output_dir)
            / f"{INSTANCE_ID}_pid_{os.getpid()}"
            / f"{time.strftime('%Y%m%d_%H%M%S')}_{next(_sessions):04d}"
        )
        session.mkdir(parents=True, exist_ok=True)
        # Like the real exporter, the framework trace uses the cycle's one Kineto save.
        prof.export_chrome_trace(str(session / FRAMEWORK_TRACE_NAME))
        modes = set(self.config.modes)
        if ProfileMode.RUNTIME in modes:
            (session / "ntrace.pb").write_bytes(b"\x0a\x04rt")
            (session / "trace_info.pb").write_bytes(b"\x0a\x04info")
        if ProfileMode.CPU_UTIL in modes:
            (session / "cpu_util.pb").write_bytes(b"\x0a\x03cpu")
        if ProfileMode.HOST_MEMORY in modes:
            (session / "host_mem.pb").write_bytes(b"\x0a\x03mem")
        if ProfileMode.DEVICE in modes:
            if self.config.neff_cache_dir:  # PyTorch profiling copies NEFFs only with a NEFF cache folder
                (session / "neff_5eed1e55_vnc_0.neff").write_bytes(b"N" * NEFF_BYTES)
            for core in CORES:
                # Cores that did not run leave empty NTFFs.
                size = NTFF_BYTES if core in ACTIVE_CORES else 0
                (session / f"profile_nc_{core}_session_{len(self.sessions)}.ntff").write_bytes(b"T" * size)
        self.sessions.append(session)
