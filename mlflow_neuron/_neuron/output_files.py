"""Finding the files a profiler cycle wrote under `profile_output_dir`.

A file belongs to a cycle when it appeared or changed since the previous cycle and is not older
than the callback. Symlinks are listed, never followed: a link may point anywhere on the machine.
Files of other processes (`<instance>_pid_<pid>` folders) are left to those processes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import layout

# Filesystems with coarse timestamps can stamp a file slightly before the callback existed.
_MTIME_SLACK_NS = 2_000_000_000

UPLOAD = "upload"
TOO_LARGE = "over_size_cap"
SYMLINK = "symlink_not_followed"


@dataclass(frozen=True)
class FoundFile:
    """A file of this cycle; `relative_path` uses `/` and is relative to the output folder."""

    path: Path
    relative_path: str
    size_bytes: int
    decision: str  # UPLOAD | TOO_LARGE | SYMLINK

    @property
    def is_framework_trace(self) -> bool:
        return layout.is_framework_trace(self.relative_path)


class OutputFolderWatcher:
    """Reports, cycle by cycle, the new or changed files under one output folder."""

    def __init__(self, root: str | os.PathLike, *, max_file_bytes: int | None, since_ns: int | None = None):
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self._since_ns = time.time_ns() - _MTIME_SLACK_NS if since_ns is None else since_ns
        self._seen: dict[str, tuple[int, int]] = {}
        self._pid = os.getpid()

    def new_files(self) -> list[FoundFile]:
        """Files written since the last call. Raises FileNotFoundError if the folder is absent."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"profile_output_dir {self.root} does not exist")
        found = []
        for folder, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if _is_link(folder, d)]:
                entry = self._check(Path(folder, name))
                if entry is not None:
                    found.append(entry)
        return found

    def _check(self, path: Path) -> FoundFile | None:
        relative = path.relative_to(self.root).as_posix()
        owner = layout.process_of(relative)
        if owner is not None and owner != self._pid:
            return None
        try:
            stat = path.lstat()
        except FileNotFoundError:  # deleted between listing and looking
            return None
        signature = (stat.st_size, stat.st_mtime_ns)
        if stat.st_mtime_ns < self._since_ns or self._seen.get(relative) == signature:
            return None
        self._seen[relative] = signature
        if path.is_symlink():
            decision = SYMLINK
        elif self.max_file_bytes is not None and stat.st_size > self.max_file_bytes:
            decision = TOO_LARGE
        else:
            decision = UPLOAD
        return FoundFile(path, relative, stat.st_size, decision)


def _is_link(folder: str, name: str) -> bool:
    return os.path.islink(os.path.join(folder, name))
