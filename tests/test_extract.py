"""Pure extraction on genuine torch event objects with chosen numbers (FACTS.md §2 shapes)."""

import re
import subprocess
import sys

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent

from mlflow_neuron import extract_cycle
from mlflow_neuron._trace.profile import KERNEL, MISSING, NOT_PROFILED, OP, PRESENT

MUL_US = 785.0  # three muls: 2,355 us, the FACTS.md §4 figure


class Trace:
    """Builds a cycle the way torch hands it over: CPU op rows with kernels plus device rows."""

    def __init__(self, use_device="neuron"):
        self.use_device = use_device
        self.events = []

    def op(self, name, start, end, kernel_us=None, legacy=False, thread=1):
        event = FunctionEvent(
            id=len(self.events), name=name, thread=thread, start_us=start, end_us=end,
            use_device=self.use_device, device_type=DeviceType.CPU, is_legacy=legacy, stack=[],
        )
        if kernel_us is not None:
            kernel = f"neuron_kernel::{name}"
            event.append_kernel(kernel, 0, kernel_us)
            if not legacy:
                self.device(kernel, end, kernel_us)
        self.events.append(event)
        return event

    def device(self, name, start, duration, annotation=False):
        self.events.append(FunctionEvent(
            id=len(self.events), name=name, thread=0, start_us=start, end_us=start + duration,
            use_device=self.use_device, device_type=DeviceType.PrivateUse1, is_user_annotation=annotation, stack=[],
        ))

    def build(self):
        events = EventList(self.events, use_device=self.use_device)
        events._build_tree()
        return events


def naive_rmsnorm_step(trace, orphan_us=None):
    trace.op("ProfilerStep#3", 0, 1000)
    trace.op("aten::mul", 10, 20, MUL_US)
    trace.op("aten::mean", 30, 60)
    trace.op("aten::sum", 35, 50, 100.0)  # nested in mean: mean's device time is its child's
    trace.op("aten::add", 70, 75, 20.0)
    trace.op("aten::rsqrt", 80, 85, 40.0)
    trace.op("aten::mul", 90, 100, MUL_US)
    trace.op("aten::mul", 110, 120, MUL_US)
    if orphan_us:
        trace.device("neuron_kernel::unlinked", 900, orphan_us)
    return trace.build()


def by_name(profile, kind=OP):
    return {op.name: op for op in profile.ops if op.kind == kind}


def test_device_time_is_attributed_to_the_launching_op_and_counted_once():
    events = naive_rmsnorm_step(Trace())
    profile = extract_cycle(events, device="neuron", device_profiled=True)
    ops = by_name(profile)
    assert ops["aten::mul"].calls == 3
    assert ops["aten::mul"].self_device_time_us == pytest.approx(3 * MUL_US)
    assert ops["aten::sum"].self_device_time_us == pytest.approx(100.0)
    assert ops["aten::mean"].self_device_time_us == 0.0
    assert ops["aten::mean"].device_time_us == pytest.approx(100.0)
    # Kernel rows repeat the same time on the device side; the total takes one side only.
    assert by_name(profile, KERNEL)["neuron_kernel::aten::mul"].self_device_time_us == pytest.approx(3 * MUL_US)
    assert profile.total_self_device_time_us == pytest.approx(3 * MUL_US + 160.0)
    assert profile.attributed_device_time_us == pytest.approx(profile.total_self_device_time_us)
    assert profile.device_time == PRESENT
    assert profile.top_ops(1)[0].name == "aten::mul"


def test_totals_agree_with_torchs_own_table():
    events = naive_rmsnorm_step(Trace(), orphan_us=50.0)
    profile = extract_cycle(events, device="neuron", device_profiled=True)
    table = events.key_averages().table(sort_by="self_device_time_total", row_limit=-1)
    device_total = re.search(r"Self NEURON time total: ([\d.]+)ms", table).group(1)
    cpu_total = re.search(r"Self CPU time total: ([\d.]+)ms", table).group(1)
    assert profile.total_self_device_time_us == pytest.approx(float(device_total) * 1000, abs=1)
    assert profile.total_self_cpu_time_us == pytest.approx(float(cpu_total) * 1000, abs=1)
    assert profile.total_self_device_time_us - profile.attributed_device_time_us == pytest.approx(50.0)


def test_top_level_aten_calls_ignore_ops_nested_in_other_aten_ops():
    events = naive_rmsnorm_step(Trace())
    profile = extract_cycle(events, device="neuron", device_profiled=True)
    assert profile.aten_calls == 6  # mul, mean, add, rsqrt, mul, mul; not the sum inside mean
    assert profile.active_steps == 1
    assert by_name(profile)["ProfilerStep*"].calls == 1


def test_legacy_rows_carry_their_kernel_on_the_cpu_event():
    trace = Trace()
    trace.op("aten::mul", 0, 10, 300.0, legacy=True)
    trace.op("aten::add", 20, 30, 50.0, legacy=True)
    profile = extract_cycle(trace.build(), device="neuron", device_profiled=True)
    assert profile.total_self_device_time_us == pytest.approx(350.0)
    assert by_name(profile)["aten::mul"].self_device_time_us == pytest.approx(300.0)
    assert profile.device_time == PRESENT


def test_device_profiled_without_device_time_is_missing_and_ranks_by_cpu():
    trace = Trace()
    trace.op("aten::mul", 0, 10)
    trace.op("aten::mean", 20, 100)
    profile = extract_cycle(trace.build(), device="neuron", device_profiled=True)
    assert profile.device_time == MISSING
    assert profile.total_self_device_time_us == 0.0
    assert [op.name for op in profile.top_ops(2)] == ["aten::mean", "aten::mul"]


def test_cpu_only_profile_is_not_profiled():
    trace = Trace(use_device=None)
    trace.op("aten::mul", 0, 10)
    profile = extract_cycle(trace.build(), device="cpu", device_profiled=False)
    assert profile.device_time == NOT_PROFILED
    assert profile.to_frame().shape[0] == 1


def test_device_side_annotations_do_not_add_to_the_device_total():
    trace = Trace()
    trace.op("aten::mul", 0, 10, 100.0)
    trace.device("my_region", 0, 500.0, annotation=True)
    profile = extract_cycle(trace.build(), device="neuron", device_profiled=True)
    assert profile.total_self_device_time_us == pytest.approx(100.0)


def test_empty_cycle():
    profile = extract_cycle(Trace().build(), device="neuron", device_profiled=True)
    assert profile.ops == () and profile.active_steps == 0 and profile.device_time == MISSING


def test_pure_layers_import_without_mlflow():
    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "import mlflow_neuron, mlflow_neuron._trace.function_events, mlflow_neuron._record.record, mlflow_neuron._neuron.output_files, "
        "mlflow_neuron._capture.settings, mlflow_neuron._record.keys, mlflow_neuron._device.devices, mlflow_neuron._neuron.torch_neuronx\n"
        "assert 'mlflow.tracking' not in sys.modules\n"
        "try:\n    mlflow_neuron.MLflowProfilerCallback\nexcept ImportError:\n    print('callback needs mlflow')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "callback needs mlflow" in result.stdout
