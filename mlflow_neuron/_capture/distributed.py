"""Which rank this process is, and the one run that all ranks of a job log into.

Rank 0's run reaches the other ranks by one broadcast in the callback's constructor: the only
collective the callback ever runs. A collective waits for every rank, so it is never made while
holding a lock that another rank takes before it (rank 0 once held the store lock through it, and
every rank's constructor waited out that lock's 60 s). After the constructor nothing here talks to
the other ranks: a rank that dies or lags never holds the others up through this package.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

from .._record.model import RunRef


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world_size: int = 1
    host: str = ""
    local_rank: int | None = None  # torchrun's LOCAL_RANK, where it is set

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def first_on_node(self) -> bool:
        """The node's first local rank (LOCAL_RANK 0; without LOCAL_RANK, rank 0): its drain sends
        what every rank of its node queued (`_delivery.producer`)."""
        return self.local_rank == 0 if self.local_rank is not None else self.is_primary


def current_rank() -> Rank:
    """From torch.distributed when it is initialized, else torchrun's `RANK`/`WORLD_SIZE`."""
    dist = _initialized_dist()
    host = socket.gethostname()
    local = os.environ.get("LOCAL_RANK", "")
    local_rank = int(local) if local.isdigit() else None
    if dist is not None:
        return Rank(dist.get_rank(), dist.get_world_size(), host, local_rank)
    return Rank(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), host, local_rank)


def in_distributed_job() -> bool:
    """Whether torch.distributed is initialized with more than one rank (the broadcast can run)."""
    dist = _initialized_dist()
    return dist is not None and dist.get_world_size() > 1


def create_primary_run(logger: Any, reporter: Any) -> RunRef:
    """Rank 0's run, created now so that its id can be sent to the other ranks; where it cannot
    be created (the server is down), the run as it was, known by its key: every rank then sends
    into the run of that key, made once by whichever consumer gets there first."""
    try:
        logger.ensure_run()
    except Exception as error:  # noqa: BLE001 - the other ranks wait in the broadcast: never skip it
        reporter.problem("shared_run", "could not create the job's run now; every rank logs into it by its key "
                         "once the server answers", error)  # fmt: skip
    return logger.run


def join_primary_run(run: RunRef, rank: Rank, reporter: Any) -> tuple[RunRef, bool]:
    """Under torch.distributed, every rank takes rank 0's run (its id, else its key), sent by one
    broadcast: every rank must call this at the same point. Returns the run to log into and
    whether this rank owns it (rank 0 ends it). Without torch.distributed, a rank other than 0
    has nothing to join and says so."""
    if not in_distributed_job():
        if not rank.is_primary:
            reporter.problem(
                "no_shared_run",
                f"rank {rank.rank} has no run id (pass run_id=, set MLFLOW_RUN_ID, or initialize "
                "torch.distributed before creating the callback); it logs into a run of its own",
            )
        return run, True
    sent = _broadcast_from_primary(
        {"run_id": run.run_id, "run_key": run.run_key, "experiment_id": run.experiment_id} if rank.is_primary else None
    )
    if rank.is_primary:
        return run, True
    if sent["run_id"] is not None:
        return RunRef(run.tracking_uri, sent["run_id"]), False
    return replace(run, experiment_id=sent["experiment_id"], run_key=sent["run_key"]), False


def primary_run(run_id: str | None, tracking_uri: str | None) -> tuple[str | None, str | None]:
    """Rank 0's (run id, tracking URI) on every rank, for a framework whose logger knows its run
    on rank 0 only; as given without torch.distributed. Every rank must call it at the same point
    (a broadcast). Where rank 0 has no run, none: the callback's constructor then sends rank 0's."""
    if not in_distributed_job():
        return run_id, tracking_uri
    sent_id, sent_uri = _broadcast_from_primary((run_id, tracking_uri))
    return sent_id, (sent_uri or tracking_uri) if sent_id is not None else tracking_uri


def _broadcast_from_primary(value: Any) -> Any:
    """`value` as rank 0 has it, on every rank. A collective."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _initialized_dist():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None
