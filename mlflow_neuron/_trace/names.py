"""Event names as torch shows them: C++ symbols demangled, `ProfilerStep#N` as one op. No torch.

torch's parse demangles every name longer than one character with `torch._C._demangle`, which
is `c10::demangle`: the C++ runtime's `abi::__cxa_demangle`, the name unchanged where that fails.
Here the same function is called through ctypes, so the helper process, which never loads libtorch,
names events exactly as the training process does (the tests compare the two on real symbols).
Where no C++ runtime with `__cxa_demangle` can be loaded, names stay as recorded, which is also
what c10 does on builds without demangling.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

STEP_PREFIX = "ProfilerStep#"  # as recorded: ProfilerStep#<step number>
STEP_NAME = "ProfilerStep*"  # as torch's parse renames it: every step is one op


def display_name(name: str) -> str:
    """The name FunctionEvent.name has: demangled, and every `ProfilerStep#N` as `ProfilerStep*`."""
    shown = demangle(name)
    return STEP_NAME if shown.startswith(STEP_PREFIX) else shown


def demangle(name: str) -> str:
    """The name as torch's parse reads it: `c10::demangle(name)` (the demangled C++ symbol, or
    `name` itself when it is not one) for names longer than one character."""
    call = _cxa_demangle()
    if call is None or len(name) < 2:
        return name
    status = ctypes.c_int(-1)
    result = call(name.encode("utf-8", "surrogatepass"), None, None, ctypes.byref(status))
    if status.value != 0 or not result:
        return name
    try:
        return ctypes.string_at(result).decode("utf-8", "surrogateescape")
    finally:
        _free()(result)


@functools.lru_cache(maxsize=1)
def _cxa_demangle():
    for library in ("libstdc++.so.6", ctypes.util.find_library("stdc++"), ctypes.util.find_library("c++abi"),
                    ctypes.util.find_library("c++")):  # fmt: skip
        if not library:
            continue
        try:
            call = getattr(ctypes.CDLL(library), "__cxa_demangle")
        except (OSError, AttributeError):
            continue
        call.restype = ctypes.c_void_p
        call.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        return call
    return None


@functools.lru_cache(maxsize=1)
def _free():
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return free
