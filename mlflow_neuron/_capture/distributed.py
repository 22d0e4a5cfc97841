"""Which rank this process is, and the one run that all ranks of a job log into."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world_size: int = 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0


def current_rank() -> Rank:
    """From torch.distributed when it is initialized, else torchrun's `RANK`/`WORLD_SIZE`."""
    dist = _initialized_dist()
    if dist is not None:
        return Rank(dist.get_rank(), dist.get_world_size())
    return Rank(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def broadcast_from_primary(value: Callable[[], str | None]) -> str | None:
    """`value()` computed on rank 0 and sent to every rank; None without torch.distributed.

    A collective: every rank must call it at the same point (the callback's constructor).
    """
    dist = _initialized_dist()
    if dist is None or dist.get_world_size() < 2:
        return None
    box = [value() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _initialized_dist():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None
