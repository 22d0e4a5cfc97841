"""Fake "neuron" accelerator profiler for tests (no device needed).

``build()`` compiles ``fake_neuron_profiler.cpp`` into a shared library that
registers a Kineto PrivateUse1 child profiler; ``activate()`` renames the
PrivateUse1 backend to "neuron" and loads it. After that, in the same process,

    with torch.profiler.profile(activities=[ProfilerActivity.CPU,
                                            ProfilerActivity.PrivateUse1]):
        ...

reports, for every CPU op named in ``FAKE_NEURON_KERNELS``, one device kernel
``neuron_kernel::<op name>`` linked to that op (so it lands in the op's
``FunctionEvent.kernels`` and in "Self NEURON" columns), plus a device-side
event (``device_type == DeviceType.PrivateUse1``) of the same name.

Environment (read when each profiling cycle is configured, so a test may change
it between sessions in one process):

* ``FAKE_NEURON_KERNELS="aten::mul=700,aten::add=50"``: op name -> kernel
  duration in microseconds (integers). Unlisted ops get nothing.
* ``FAKE_NEURON_MODE=kernels`` (default) or ``runtime``: in runtime mode the
  same ops get host-side ``neuron_runtime::<op>`` (PRIVATEUSE1_RUNTIME) and
  ``neuron_driver::<op>`` (PRIVATEUSE1_DRIVER) events instead, which torch
  shows as CPU rows with zero device time.
* Seeded noise, to calibrate comparisons (kernels mode): ``FAKE_NEURON_JITTER=0.3``
  scales each kernel by U(0.7, 1.3); ``FAKE_NEURON_STALL_RATE=0.02`` makes 2% of
  kernels stall, taking ``FAKE_NEURON_STALL_FACTOR`` (default 10) times longer;
  ``FAKE_NEURON_SEED`` seeds it (cycle k of a process uses seed + k).

Renaming the backend and registering the profiler are process-wide and cannot
be undone: call ``activate()`` only in a dedicated (sub)process.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess

__all__ = [
    "BACKEND_NAME",
    "KERNEL_PREFIX",
    "SOURCE",
    "FakeDeviceUnavailable",
    "build",
    "activate",
]

BACKEND_NAME = "neuron"
KERNEL_PREFIX = "neuron_kernel::"
SOURCE = pathlib.Path(__file__).with_name("fake_neuron_profiler.cpp")
_SO_NAME = "fake_neuron_profiler.so"


class FakeDeviceUnavailable(Exception):
    """The fake device cannot be built or loaded here (tests should skip)."""


def _compile_command(out: pathlib.Path) -> list[str]:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a test dependency
        raise FakeDeviceUnavailable(f"torch not importable: {e}") from e

    cxx = os.environ.get("CXX", "g++")
    gxx = shutil.which(cxx)
    if gxx is None:
        raise FakeDeviceUnavailable(f"no C++ compiler ({cxx}) on PATH")

    root = pathlib.Path(torch.__file__).parent
    inc, lib = root / "include", root / "lib"
    needed = [
        inc / "torch/csrc/profiler/standalone/privateuse1_profiler.h",
        inc / "kineto/IActivityProfiler.h",
        inc / "kineto/libkineto.h",
    ]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise FakeDeviceUnavailable(f"torch headers missing: {', '.join(missing)}")

    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    return [
        gxx, "-shared", "-fPIC", "-std=c++20", "-O1", "-w",
        "-DUSE_KINETO", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{inc}", f"-I{inc / 'kineto'}", f"-I{inc / 'torch/csrc/api/include'}",
        "-o", str(out), str(SOURCE),
        # Libraries after the source: otherwise the linker drops them and the
        # .so fails to load with undefined libkineto symbols.
        f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}",
    ]  # fmt: skip


def build(build_dir: pathlib.Path) -> pathlib.Path:
    """Compile the fake profiler into ``build_dir`` (cached) and return the .so path.

    Raises FakeDeviceUnavailable when the compiler or torch headers are missing or
    compilation fails.
    """
    build_dir = pathlib.Path(build_dir)
    out = build_dir / _SO_NAME
    if out.exists() and out.stat().st_mtime > SOURCE.stat().st_mtime:
        return out
    cmd = _compile_command(out)
    build_dir.mkdir(parents=True, exist_ok=True)
    # Compile to a temp name and rename, so concurrent builders never load a
    # half-written library.
    tmp = build_dir / f".{_SO_NAME}.{os.getpid()}.tmp"
    cmd[cmd.index(str(out))] = str(tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FakeDeviceUnavailable(f"running the compiler failed: {e}") from e
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise FakeDeviceUnavailable(
            f"compiling {SOURCE.name} failed (exit {proc.returncode}):\n{tail}"
        )
    os.replace(tmp, out)
    return out


_loaded: ctypes.CDLL | None = None


def activate(so_path: pathlib.Path) -> ctypes.CDLL:
    """Rename PrivateUse1 to "neuron" and load the fake profiler (irreversible).

    Nothing else is needed: no ``torch.neuron`` module, no legacy profiler stubs,
    no tensors on the device. Idempotent within a process.
    """
    global _loaded
    import torch

    current = torch._C._get_privateuse1_backend_name()
    if current == "privateuseone":
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    elif current != BACKEND_NAME:
        raise FakeDeviceUnavailable(
            f"PrivateUse1 backend already renamed to {current!r} in this process"
        )
    if _loaded is None:
        try:
            _loaded = ctypes.CDLL(str(so_path), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise FakeDeviceUnavailable(f"loading {so_path} failed: {e}") from e
    return _loaded

