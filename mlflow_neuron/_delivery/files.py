"""Putting a cycle's files where they go without holding them in memory: links, copies, gzip."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

from .model import Delivery


def link_or_copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """A hard link where the filesystem allows (no copy, no extra disk), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def gzip_file(source: Path, target: Path) -> None:
    """Streams `source` into gzip `target` (constant memory); copies a file already gzipped."""
    if source.suffix == ".gz":
        shutil.copyfile(source, target)
        return
    with open(source, "rb") as fin, gzip.open(target, "wb", compresslevel=1) as fout:
        shutil.copyfileobj(fin, fout, 1024 * 1024)


def sent_files(delivery: Delivery, vanished: list[str] = ()) -> dict[str, int]:
    """{path: bytes} of every file a delivery uploads: the generated ones and the profile's own."""
    files = {}
    if delivery.files_dir and os.path.isdir(delivery.files_dir):
        trace_spans = Path(delivery.files_dir, delivery.trace_spans) if delivery.trace_spans else None  # not an artifact
        for path in Path(delivery.files_dir).rglob("*"):
            if path.is_file() and path != trace_spans:
                files[str(path)] = path.stat().st_size
    for source, _ in delivery.uploads:
        if source not in vanished and os.path.isfile(source):
            files[source] = os.path.getsize(source)
    return files


def human_size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
