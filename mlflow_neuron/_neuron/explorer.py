"""`mlflow-neuron open RUN [--step N]`: from a run in the MLflow UI to Neuron Explorer in one command.

Downloads the cycle's Neuron session files (`profiler/step_<N>/neuron/` to `<dest>/neuron/`, with
their layout, and the cycle's `manifest.json` to `<dest>/`, whose view commands are relative to
`<dest>/neuron`) and runs `neuron-explorer view -d <session>` when the tool is
installed; otherwise it prints that command line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .._neuron import devices as _devices
from .._compare.runs import RunNotFound
from .._delivery.record import MANIFEST

DEFAULT_DEST = "mlflow-neuron-open"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class OpenedProfile:
    """What was downloaded, and the command that opens it."""

    run_id: str
    step: int
    neuron_dir: Path  # the local copy of profiler/step_<N>/neuron
    session: Path  # what `view -d` gets: the one session folder, or neuron_dir when there are several
    command: list[str]


def download(run_id: str, step: int | None = None, dest: str | os.PathLike | None = None,
             tracking_uri: str | None = None) -> OpenedProfile:  # fmt: skip
    """Downloads a cycle's Neuron files; `step` defaults to the last cycle that has some.

    Raises RunNotFound for an unknown run, ValueError when the run (or that step) has no Neuron files.
    """
    client = MlflowClient(tracking_uri)
    try:
        client.get_run(run_id)
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunNotFound(f"run {run_id} does not exist") from error
        raise
    with_files = _steps_with_neuron_files(client, run_id)
    if not with_files:
        raise ValueError(f"run {run_id} has no Neuron session files (no profiler/step_<N>/neuron/ artifacts)")
    if step is None:
        step = with_files[-1]
    elif step not in with_files:
        raise ValueError(f"run {run_id} has no Neuron session files at step {step}; steps that have: "
                         f"{', '.join(map(str, with_files))}")  # fmt: skip
    target = Path(dest) if dest is not None else Path(DEFAULT_DEST) / run_id / f"step_{step}"
    target.mkdir(parents=True, exist_ok=True)
    step_dir = f"profiler/step_{step}"
    neuron_dir = Path(client.download_artifacts(run_id, f"{step_dir}/neuron", str(target.resolve())))
    if any(item.path == f"{step_dir}/{MANIFEST}" for item in client.list_artifacts(run_id, step_dir)):
        client.download_artifacts(run_id, f"{step_dir}/{MANIFEST}", str(target.resolve()))
    sessions = sorted({p.parent for p in neuron_dir.rglob("*") if p.suffix in (".ntff", ".neff") and p.is_file()})
    session = sessions[0] if len(sessions) == 1 else neuron_dir
    tool = _devices.neuron_summary_tool() or _devices.NEURON_VIEW_TOOL
    return OpenedProfile(run_id, step, neuron_dir, session, _devices.view_session_command(str(session), tool))


def open_in_explorer(opened: OpenedProfile, *, launch: bool = True, out=None) -> int:
    """Runs the view command when the tool is installed (it serves the UI until stopped), else
    prints it. Returns 0, or 1 when the tool exits with an error."""
    out = out or sys.stdout
    line = shlex.join(opened.command)
    print(f"run {opened.run_id} step {opened.step}: Neuron files in {opened.neuron_dir}", file=out, flush=True)
    installed = _devices.neuron_summary_tool() is not None
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


def _steps_with_neuron_files(client: MlflowClient, run_id: str) -> list[int]:
    steps = []
    for item in client.list_artifacts(run_id, "profiler"):
        match = _STEP_DIR.match(item.path.rsplit("/", 1)[-1])
        if item.is_dir and match and client.list_artifacts(run_id, f"{item.path}/neuron"):
            steps.append(int(match.group(1)))
    return sorted(steps)
