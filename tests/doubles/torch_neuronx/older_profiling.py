"""Test double of the older `torch_neuronx.profiling` API, as public torch-neuronx code shows it.

There, `NeuronProfiler` is a context manager with no `NeuronConfig`: it starts Neuron runtime
(NRT) profiling into `neuron_output_dir` and, given `pytorch_activities`, its own
`torch.profiler.profile`, whose trace it saves as `<neuron_output_dir>/pytorch_trace.json` on
stop. Tests put this module in place of `torch_neuronx.profiling` to play an older install.
The runtime's session folder below `neuron_output_dir` is this double's assumption (the layout
of the current API); its contents are stand-in bytes.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from torch.profiler import profile

INSTANCE_ID = "i-0fa1ce0000000old"
PYTORCH_TRACE_FILE_NAME = "pytorch_trace.json"
_sessions = itertools.count()


class NeuronProfiler:
    def __init__(
        self,
        pytorch_activities=None,
        record_shapes: bool = False,
        pytorch_trace_file: str | None = None,
        neuron_output_dir: str = "./output",
        event_filters: dict | None = None,
    ) -> None:
        self.pytorch_activities = pytorch_activities or []
        self.record_shapes = record_shapes
        self.neuron_output_dir = neuron_output_dir
        if self.pytorch_activities:
            self.pytorch_trace_file = f"{neuron_output_dir}/{pytorch_trace_file or PYTORCH_TRACE_FILE_NAME}"
        else:
            self.pytorch_trace_file = None
        self.event_filters = event_filters
        self._pytorch_profiler = None

    def __enter__(self):
        os.makedirs(self.neuron_output_dir, exist_ok=True)
        if self.pytorch_activities:
            self._pytorch_profiler = profile(activities=self.pytorch_activities, record_shapes=self.record_shapes)
            self._pytorch_profiler.__enter__()
        return self

    def __exit__(self, *exc_info):
        if self._pytorch_profiler is not None:
            self._pytorch_profiler.__exit__(None, None, None)
            self._pytorch_profiler.export_chrome_trace(self.pytorch_trace_file)
        session = (Path(self.neuron_output_dir) / f"{INSTANCE_ID}_pid_{os.getpid()}"
                   / f"{time.strftime('%Y%m%d_%H%M%S')}_{next(_sessions):03d}")
        session.mkdir(parents=True, exist_ok=True)
        (session / "ntrace.pb").write_bytes(b"\x0a\x04rt")
        (session / "trace_info.pb").write_bytes(b"\x0a\x04info")
        (session / "neff_7e57_vnc_0.neff").write_bytes(b"N" * 64)
        (session / "7e57_instid_0_vnc_0.ntff").write_bytes(b"T" * 64)
        stamp = time.strftime("%Y%m%d_%H%M%S")
        (Path(self.neuron_output_dir) / f"framework_mapping_{stamp}_000.json").write_text('{"data": []}')
        return False

    def get_nrt_output_directory(self) -> str:
        return self.neuron_output_dir
