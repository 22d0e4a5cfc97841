"""Neuron Explorer's summary of a cycle's capture sessions: numbers per model, the tools' versions as
tags, and what went wrong. Runs where the cycle is prepared, off the training thread.

Each session's summary comes from the first source that answers:

1. with `neuron-explorer` installed, its Parquet output into a temporary folder of ours
   (`explorer_run`), else, when that fails, its `summary-json`;
2. the user's own processed copy under `MLFLOW_NEURON_EXPLORER_DATA_PATH` (`processed`);
3. Summary/Metadata tables inside the session folder (an `--output-file` the user pointed there).

Beside the numbers: a session whose NTFFs have no NEFF beside them (Explorer cannot read an NTFF
without its NEFF) is reported, naming the setting that makes PyTorch profiling copy the NEFFs; and
the Metadata's versions become tags (`_trace.neuron_fields.METADATA_TAGS`), with a warning when the
schema's major version is not one this reader was tested with.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .._trace.neuron_fields import METADATA_TAGS, TESTED_SCHEMA_MAJORS, VERSION_TAG_PREFIX, schema_major
from .explorer_run import explorer_timeout_s, run_to_parquet, say_on_stderr
from .processed import Processed, read_processed, read_users_data_path
from .summary import SummaryError, run_summary_tool

NEFF_SETTING = "NeuronConfig(neff_cache_dir=...) or TORCH_NEURONX_NEFF_CACHE_DIR"


@dataclass
class SessionsSummary:
    """`models`: {model: {field: number}} of every session; `tags`: the version tags; `problems`:
    (kind, message) pairs, each kind reported once per run."""

    models: dict[str, dict[str, float]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)


def summarize_sessions(sessions: tuple[str, ...], tool: str | None, step: int, say=say_on_stderr) -> SessionsSummary:
    """Every session of cycle `step` summarized (see the module docstring); `tool`: neuron-explorer, or None."""
    found = SessionsSummary()
    for name in sessions:
        session = Path(name)
        missing = ntffs_without_neff(session)
        if missing:
            found.problems.append(("neff_missing", f"{len(missing)} NTFF(s) in {session} have no NEFF beside them "
                                   f"(first: {missing[0]}); Neuron Explorer cannot read an NTFF without its NEFF. "
                                   f"Set {NEFF_SETTING} so that PyTorch profiling copies the NEFFs into the profile "
                                   "folder (mlflow_neuron.profiling_setup passes one)"))  # fmt: skip
        processed = _one_session(session, tool, found.problems, say)
        repeated = sorted(set(processed.models) & set(found.models))
        if repeated:
            found.problems.append(("neuron_summary_repeated", f"model(s) {', '.join(repeated)} were summarized "
                                   f"in several sessions of step {step}; the last one's numbers are logged"))  # fmt: skip
        found.models.update(processed.models)
        for tag, value in version_tags(processed.metadata).items():
            found.tags.setdefault(tag, value)
    schema = found.tags.get(VERSION_TAG_PREFIX + "profile_schema_version")
    if schema and schema_major(schema) not in TESTED_SCHEMA_MAJORS:
        tested = ", ".join(f"{m}.x" for m in TESTED_SCHEMA_MAJORS)
        found.problems.append(("neuron_schema_version", f"Neuron Explorer's profile schema {schema} has a major "
                               f"version this reader was not tested with ({tested}): fields may have been removed or "
                               "renamed. Every field is still logged as written; pin the tool version for "
                               "automation"))  # fmt: skip
    return found


def _one_session(session: Path, tool: str | None, problems: list, say) -> Processed:
    if tool:
        try:
            timeout_s = explorer_timeout_s()
        except SummaryError as error:
            problems.append(("neuron_summary", str(error)))
            return Processed()
        out_dir = Path(tempfile.mkdtemp(prefix="mlflow-neuron-explorer-"))
        try:
            return run_to_parquet(tool, session, out_dir, timeout_s, say)
        except SummaryError as error:
            parquet_error = error
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        try:
            models = run_summary_tool(tool, str(session), timeout_s)
        except SummaryError as error:  # the tool failed both ways: one problem names both
            problems.append(("neuron_summary", f"Neuron Explorer summary of {session} failed: its Parquet output: "
                             f"{parquet_error}; its --output-format summary-json: {error}"))  # fmt: skip
            return Processed()
        problems.append(("neuron_explorer_parquet", f"Neuron Explorer's Parquet output of {session}: {parquet_error}; "
                         "falling back to --output-format summary-json"))  # fmt: skip
        return Processed(models=models)
    for source, read in (("the processed copy", read_users_data_path), ("the tables", read_processed)):
        try:
            processed = read(session)
        except SummaryError as error:
            problems.append(("neuron_summary", f"Summary.parquet of {session} ({source}): {error}"))
            continue
        if not processed.empty:
            return processed
    return Processed()


def version_tags(metadata: dict[str, str]) -> dict[str, str]:
    """Version tags from a Metadata row: each column of METADATA_TAGS that is there."""
    return {VERSION_TAG_PREFIX + tag: metadata[column][:250] for tag, column in METADATA_TAGS.items()
            if metadata.get(column)}  # fmt: skip


def ntffs_without_neff(session: Path) -> list[str]:
    """The non-empty NTFFs of a session folder that holds no NEFF (empty NTFFs are cores that did
    not run; links are left out)."""
    try:  # links are never followed: a link may point anywhere on the machine
        sizes = {p.name: p.lstat().st_size for p in session.iterdir() if not p.is_symlink() and p.is_file()}
    except OSError:
        return []
    if any(n.endswith(".neff") for n in sizes):
        return []
    return sorted(n for n, size in sizes.items() if n.endswith(".ntff") and size > 0)
