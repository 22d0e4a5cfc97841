"""Self-check for the fake neuron profiler.

    /work/venv/bin/python tests/fake_device/check_fake_device.py

Builds the library, then runs each case in its own subprocess (the backend
rename and profiler registration are process-wide and irreversible).
Exit status 0 when every case passes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # makes `fake_device` importable
import fake_device  # noqa: E402

KERNELS = "aten::mul=700,aten::rsqrt=100"


def rmsnorm(x, weight, eps=1e-6):
    # Naive on purpose: 3 x aten::mul, 1 x aten::rsqrt, plus mean/add.
    import torch

    rms = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return x * rms * weight


def _profile(**kw):
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], **kw)


def _row(prof, key):
    rows = [r for r in prof.key_averages() if r.key == key]
    assert len(rows) == 1, f"expected one {key!r} row, got {len(rows)}"
    return rows[0]


def _device_total(prof):
    from torch.autograd import DeviceType

    return sum(
        e.self_device_time_total
        for e in prof.events()
        if e.device_type == DeviceType.PrivateUse1
    )


def case_kernels():
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x, w = torch.randn(4, 512), torch.randn(512)
    with _profile() as prof:
        rmsnorm(x, w)
    print(prof.key_averages().table(sort_by="self_privateuse1_time_total", row_limit=12))

    mul, rsqrt = _row(prof, "aten::mul"), _row(prof, "aten::rsqrt")
    assert mul.count == 3 and mul.self_device_time_total == 3 * 700, mul
    assert rsqrt.self_device_time_total == 100, rsqrt
    assert _row(prof, "aten::add").self_device_time_total == 0
    assert _device_total(prof) == 2200, _device_total(prof)

    muls = [e for e in prof.events() if e.name == "aten::mul"]
    assert all([k.name for k in e.kernels] == ["neuron_kernel::aten::mul"] for e in muls)
    dev = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert sorted(e.name for e in dev) == ["neuron_kernel::aten::mul"] * 3 + [
        "neuron_kernel::aten::rsqrt"
    ], [e.name for e in dev]
    # Fake stream: kernels are queued back to back, never overlapping.
    spans = sorted((e.time_range.start, e.time_range.end) for e in dev)
    assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:])), spans

    # A CPU-only profile in the same process must not grow fake kernels.
    with profile(activities=[ProfilerActivity.CPU]) as cpu_prof:
        rmsnorm(x, w)
    assert not any(e.kernels for e in cpu_prof.events())
    assert all(e.device_type == DeviceType.CPU for e in cpu_prof.events())
    print("kernels: OK")


def case_runtime():
    import torch

    x, w = torch.randn(4, 512), torch.randn(512)
    with _profile() as prof:
        rmsnorm(x, w)
    print(prof.key_averages().table(sort_by="self_privateuse1_time_total", row_limit=12))
    names = {r.key for r in prof.key_averages()}
    assert {"neuron_runtime::aten::mul", "neuron_driver::aten::rsqrt"} <= names, names
    assert all(r.self_device_time_total == 0 for r in prof.key_averages())
    assert all(e.self_device_time_total == 0 for e in prof.events())
    assert all(not e.kernels for e in prof.events())
    print("runtime: OK")


def case_schedule(trace_dir: str):
    import torch

    x, w = torch.randn(4, 512), torch.randn(512)
    cycles = []

    def on_trace_ready(p):
        path = os.path.join(trace_dir, f"cycle{len(cycles)}.json")
        p.export_chrome_trace(path)
        mul = _row(p, "aten::mul")
        cycles.append((mul.count, mul.self_device_time_total, _device_total(p), path))

    sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2)
    with _profile(schedule=sched, on_trace_ready=on_trace_ready) as prof:
        for step in range(6):
            if step == 3:  # before cycle 2 is configured: new durations
                os.environ["FAKE_NEURON_KERNELS"] = "aten::mul=300,aten::rsqrt=10"
            # cycle 1 active step (2) runs one rmsnorm, cycle 2 (5) two.
            for _ in range(1 if step < 3 else 2):
                rmsnorm(x, w)
            prof.step()

    print("cycles (mul count, mul self device us, device total us, trace):")
    for c in cycles:
        print("  ", c)
    assert [c[:3] for c in cycles] == [(3, 2100, 2200), (6, 1800, 1820)], cycles
    for path, n in ((cycles[0][3], 4), (cycles[1][3], 8)):
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        kern = [e for e in events if e.get("cat") == "kernel"]
        assert len(kern) == n and all(e["name"].startswith("neuron_kernel::") for e in kern), kern
        print(f"   {os.path.basename(path)}: {len(kern)} cat=kernel events, e.g. {kern[0]}")
    print("schedule: OK")


def _child(case: str, so: str, extra: list[str]) -> None:
    fake_device.activate(pathlib.Path(so))
    {"kernels": case_kernels, "runtime": case_runtime, "schedule": case_schedule}[case](*extra)


def main() -> int:
    build_dir = pathlib.Path(tempfile.gettempdir()) / f"fake_neuron_build_{os.getuid()}"
    try:
        so = fake_device.build(build_dir)
    except fake_device.FakeDeviceUnavailable as e:
        print(f"SKIP: {e}")
        return 0
    print(f"built {so}")
    failed = []
    with tempfile.TemporaryDirectory() as trace_dir:
        for case, mode, extra in (
            ("kernels", "kernels", []),
            ("runtime", "runtime", []),
            ("schedule", "kernels", [trace_dir]),
        ):
            env = dict(os.environ, FAKE_NEURON_KERNELS=KERNELS, FAKE_NEURON_MODE=mode)
            print(f"\n===== {case} (FAKE_NEURON_MODE={mode}) =====", flush=True)
            rc = subprocess.run(
                [sys.executable, __file__, "--child", case, str(so), *extra], env=env
            ).returncode
            if rc != 0:
                failed.append(case)
    print("\nFAILED: " + ", ".join(failed) if failed else "\nALL OK")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4:])
        sys.exit(0)
    sys.exit(main())
