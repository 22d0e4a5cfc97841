"""A processed Neuron Explorer profile on disk: its Summary and Metadata tables, read (no subprocess).

Explorer writes each processed profile as a folder of Parquet tables named after the table
(`Summary.parquet`, `Metadata.parquet`, ...; a large table split as `Summary_0.parquet`,
`Summary_1.parquet`, ...; a table only when the profile has that activity). The folder is the one
given with `--output-file`, or `<data-path>/profiles/global/<name>@latest/`. How the several device
profiles of one session lie in an `--output-file` folder is not documented, so it is read off the
folder: every folder at or below it that holds a Summary or Metadata table is one profile, keyed
by its path (the top folder: `summary.FLAT`). A Summary table of several rows gives one model per
row (`<key>_row_<i>`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .summary import FLAT, SummaryError, numbers, read_parquet_rows

SUMMARY, METADATA = "Summary", "Metadata"
# A folder Explorer's UI or `view --data-path` processed: `<data-path>/profiles/global/<name>@latest/`.
DATA_PATH_ENV = "MLFLOW_NEURON_EXPLORER_DATA_PATH"
_SPLIT = re.compile(r"^(?P<table>[A-Za-z]+)(?:_(?P<part>\d+))?\.parquet$")


@dataclass
class Processed:
    """What a processed profile folder holds: `{model: {field: number}}`, and the text and numbers
    of its first Metadata row (versions, feature-detected by the reader of `metadata`)."""

    models: dict[str, dict[str, float]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.models and not self.metadata


def table_files(folder: Path, table: str) -> list[Path]:
    """`<table>.parquet` and its numbered parts in `folder`, in part order; links are not followed."""
    found = []
    for path in folder.iterdir():
        match = _SPLIT.match(path.name)
        if match and match.group("table") == table and path.is_file() and not path.is_symlink():
            found.append((int(match.group("part") or -1), path))
    return [path for _, path in sorted(found)]


def profile_folders(root: Path) -> list[Path]:
    """The folders at or below `root` that hold a Summary or Metadata table."""
    found = []
    for folder, dirnames, _ in os.walk(root, followlinks=False):
        dirnames.sort()
        here = Path(folder)
        if table_files(here, SUMMARY) or table_files(here, METADATA):
            found.append(here)
    return found


def read_processed(root: str | os.PathLike) -> Processed:
    """Every processed profile at or below `root`. Raises SummaryError for a table that cannot be read."""
    root = Path(root)
    result = Processed()
    if not root.is_dir():
        return result
    for folder in profile_folders(root):
        key = FLAT if folder == root else folder.relative_to(root).as_posix()
        rows = read_parquet_rows(table_files(folder, SUMMARY))
        if len(rows) == 1:
            result.models[key] = numbers(rows[0])
        for i, row in enumerate(rows if len(rows) > 1 else ()):
            result.models[f"{key}_row_{i}" if key else f"row_{i}"] = numbers(row)
        metadata = read_parquet_rows(table_files(folder, METADATA))
        if metadata and not result.metadata:
            result.metadata = {str(k): str(v) for k, v in metadata[0].items() if isinstance(v, (str, int, float))
                               and not isinstance(v, bool) and str(v).strip()}  # fmt: skip
    return result


def data_path_profile(data_path: str | os.PathLike, name: str) -> Path:
    """Where Explorer keeps the profile processed under the display name `name`."""
    return Path(data_path) / "profiles" / "global" / f"{name}@latest"


def read_users_data_path(session: Path) -> Processed:
    """The session as the user already processed it into `MLFLOW_NEURON_EXPLORER_DATA_PATH`, under the
    session folder's name (`<data-path>/profiles/global/<session name>@latest/`); empty when absent."""
    data_path = os.environ.get(DATA_PATH_ENV, "").strip()
    if not data_path:
        return Processed()
    try:
        return read_processed(data_path_profile(data_path, session.name))
    except SummaryError as error:
        raise SummaryError(f"{DATA_PATH_ENV}: {error}") from error
