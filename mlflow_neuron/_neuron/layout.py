"""The Neuron profiler's output on disk: per-process folders, capture sessions, framework traces,
NEFF/NTFF pairs, and Neuron Explorer's command lines. Pure file-name knowledge: no torch.

Layout (one folder per process, one per capture session)::

    <profile_output_dir>/<instance-id>_pid_<pid>/<timestamp>/
        trace.json  ntrace.pb  trace_info.pb  neff_<hash>_vnc_0.neff  profile_nc_<N>_session_<M>.ntff

A session with only `ntrace.pb` and `trace_info.pb` (ProfileMode.RUNTIME alone) is a system
profile: Explorer opens it with `view -d` like the others.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil

# How NeuronProfiler names the framework trace: export_trace in a session folder, and the older
# context-manager profiler as `pytorch_trace.json` in its `neuron_output_dir`.
NEURON_FRAMEWORK_TRACE_PATTERNS = ("trace.json", "neuron_framework_trace_rank_*.json", "pytorch_trace.json")

# `<instance-id>_pid_<pid>` is the per-process folder of the Neuron output layout.
_PROCESS_FOLDER = re.compile(r"_pid_(\d+)$")


def process_of(relative_path: str) -> int | None:
    """The pid a Neuron output file belongs to, from its `<instance>_pid_<pid>` folder."""
    first = relative_path.replace("\\", "/").split("/", 1)[0]
    match = _PROCESS_FOLDER.search(first)
    return int(match.group(1)) if match else None


def is_framework_trace(relative_path: str) -> bool:
    name = relative_path.replace("\\", "/").rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) for p in NEURON_FRAMEWORK_TRACE_PATTERNS)


# Neuron Explorer (aws-neuronx-tools); `neuron-profile` has not shipped since Neuron 2.30.
NEURON_VIEW_TOOL = "neuron-explorer"
NEURON_TOOLS_DIR = "/opt/aws/neuron/bin"
# A system profile (ProfileMode.RUNTIME) is a folder with both of these, with or without NEFF/NTFF.
SYSTEM_PROFILE_FILES = ("ntrace.pb", "trace_info.pb")


def neuron_summary_tool() -> str | None:
    return find_neuron_tool(NEURON_VIEW_TOOL)


def find_neuron_tool(*names: str) -> str | None:
    """The first of `names` found on PATH or in the Neuron tools folder."""
    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), NEURON_TOOLS_DIR) if p)
    for name in names:
        found = shutil.which(name, path=search)
        if found:
            return found
    return None


def is_neuron_session(folder_files: list[str]) -> bool:
    """A capture session folder: it holds a device trace or its executable (a device profile), or
    `ntrace.pb` and `trace_info.pb` (a system profile)."""
    names = set(folder_files)
    return any(name.endswith((".ntff", ".neff")) for name in names) or names.issuperset(SYSTEM_PROFILE_FILES)


def session_folders(relative_paths: list[str]) -> list[str]:
    """The capture session folders among files given by `/`-separated paths ("" for the top folder)."""
    by_folder: dict[str, list[str]] = {}
    for path in relative_paths:
        folder, _, name = path.replace("\\", "/").rpartition("/")
        by_folder.setdefault(folder, []).append(name)
    return sorted(folder for folder, names in by_folder.items() if is_neuron_session(names))


# A device trace is readable only with the NEFF it was captured from. Their names share a hash:
# `neff_<hash>[_vnc_<n>].neff` pairs with `<hash>_instid_<i>_vnc_<n>.ntff`. Session traces named
# `profile_nc_<N>_session_<M>.ntff` carry no hash: they pair with the session's only NEFF.
_NEFF_HASH = re.compile(r"^neff_([0-9A-Za-z]+?)(?:_vnc_\d+)?\.neff$")
_NTFF_HASH = re.compile(r"^([0-9A-Za-z]+)_instid_\d+_vnc_\d+\.ntff$")


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
