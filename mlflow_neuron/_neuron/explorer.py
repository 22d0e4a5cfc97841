"""`mlflow-neuron open`'s last step: a cycle's downloaded Neuron files opened in Neuron Explorer.

`_readback.runs.download_neuron_files` brings `profiler/step_<N>/neuron/` (layout kept) and the
cycle's `manifest.json`; here `neuron-explorer view -d <session>` runs when the tool is installed,
and otherwise its command line is printed.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import layout


@dataclass(frozen=True)
class OpenedProfile:
    """What was downloaded, and the command that opens it."""

    run_id: str
    step: int
    neuron_dir: Path  # the local copy of profiler/step_<N>/neuron
    session: Path  # what `view -d` gets: the one session folder, or neuron_dir when there are several
    command: list[str]


def opened_profile(run_id: str, step: int, neuron_dir: Path) -> OpenedProfile:
    """What `view -d` gets for a downloaded `profiler/step_<N>/neuron/` folder: its one capture
    session, or the whole folder when it holds several."""
    files = [p.relative_to(neuron_dir).as_posix() for p in neuron_dir.rglob("*") if p.is_file()]
    sessions = layout.session_folders(files)  # device profiles, and system-only ones
    session = neuron_dir / sessions[0] if len(sessions) == 1 else neuron_dir
    tool = layout.neuron_summary_tool() or layout.NEURON_VIEW_TOOL
    return OpenedProfile(run_id, step, neuron_dir, session, layout.view_session_command(str(session), tool))


def open_in_explorer(opened: OpenedProfile, *, launch: bool = True, out=None) -> int:
    """Runs the view command when the tool is installed (it serves the UI until stopped), else
    prints it. Returns 0, or 1 when the tool exits with an error."""
    out = out or sys.stdout
    line = shlex.join(opened.command)
    print(f"run {opened.run_id} step {opened.step}: Neuron files in {opened.neuron_dir}", file=out, flush=True)
    installed = layout.neuron_summary_tool() is not None
    if not (launch and installed):
        reason = "" if installed else " (neuron-explorer is not installed here: it comes with aws-neuronx-tools)"
        print(f"open it with{reason}:\n  {line}", file=out, flush=True)
        return 0
    print(f"running: {line}", file=out, flush=True)
    try:
        code = subprocess.call(opened.command)
    except KeyboardInterrupt:  # the viewer serves until stopped; Ctrl-C is the way out
        return 0
    if code != 0:
        print(f"{opened.command[0]} exited {code}", file=out, flush=True)
        return 1
    return 0
