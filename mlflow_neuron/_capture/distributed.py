"""Which rank this process is, and the one run that all ranks of a job log into."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


def join_primary_run(logger: Any, rank: Rank, reporter: Any) -> tuple[Any, bool]:
    """Under torch.distributed, every rank takes rank 0's run (created now, collectively). Returns
    the run to log into and whether this rank owns it (rank 0 ends it)."""
    shared = broadcast_from_primary(logger.ensure_run)
    if shared is not None:
        return (logger.run if rank.is_primary else type(logger.run)(logger.run.tracking_uri, shared)), rank.is_primary
    if not rank.is_primary:
        reporter.problem(
            "no_shared_run",
            f"rank {rank.rank} has no run id (pass run_id=, set MLFLOW_RUN_ID, or initialize "
            "torch.distributed before creating the callback); it logs into a run of its own",
        )
    return logger.run, True
