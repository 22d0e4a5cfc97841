"""Rank summaries built from chosen numbers, in the exact format each rank logs (for tests and
benchmarks/ranks_scale.py).

    job = Job(world_size=4, slow_rank=2, delay_us=30_000)       # rank 2 computes 30 ms longer
    summaries = job.cycle(cycle_step=10, steps=range(5))       # one dict per rank
    log_job(client, run_id, [job.cycle(10, range(5)), job.cycle(20, range(10, 15))])

A step on every rank: `idle_us` of nothing, compute (its own length), then one all_reduce that each rank enters when its
compute ends and that ends on every rank `transfer_us` after the last rank entered. So a rank's
wait at each all_reduce is (the latest arrival) - (its own arrival), exactly, and the straggler is
whichever rank computes longest. Each rank keeps its own clock: `clock_offset_us[r]` shifts every
time of rank r, as a host whose clock disagrees would.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

FORMAT, VERSION = "mlflow-neuron/rank-summary", 1


@dataclass
class Job:
    world_size: int = 4
    slow_rank: int | None = None
    delay_us: float = 0.0  # extra compute of the slow rank, every step
    compute_us: float = 70_000.0
    transfer_us: float = 2_000.0
    jitter_us: float = 300.0  # each rank's compute varies by up to this much, seeded
    idle_us: float = 0.0  # each step opens with this much of nothing running (a data loader's wait)
    hosts: list[str] | None = None  # default: ip-10-0-0-<rank // 8>, eight ranks a host
    clock_offset_us: dict[int, float] = field(default_factory=dict)
    seed: int = 0

    def host(self, rank: int) -> str:
        return self.hosts[rank] if self.hosts else f"ip-10-0-0-{rank // 8}"

    def cycle(self, cycle_step: int, steps) -> list[dict]:
        """Every rank's summary of one profiled cycle holding `steps`."""
        rng = random.Random(f"{self.seed}-{cycle_step}")
        summaries = {r: self._empty(r, cycle_step) for r in range(self.world_size)}
        now = 1_000_000.0 * (cycle_step + 1)  # one shared true clock; each rank reports it shifted
        for step in steps:
            arrivals = {r: now + self.idle_us + self.compute_us + rng.uniform(0, self.jitter_us) +
                        (self.delay_us if r == self.slow_rank else 0.0) for r in range(self.world_size)}  # fmt: skip
            end = max(arrivals.values()) + self.transfer_us
            for r, summary in summaries.items():
                shift = self.clock_offset_us.get(r, 0.0)
                collective = end - arrivals[r]
                summary["steps"].append({
                    "step": step, "start_us": now + shift, "end_us": end + shift, "step_us": end - now, "window_us": end - now,
                    "compute_us": arrivals[r] - now - self.idle_us, "collective_us": collective,
                    "exposed_comm_us": collective, "idle_us": self.idle_us, "memcpy_us": 0.0, "memcpy_bytes": None, "peak_memory_bytes": None,
                })  # fmt: skip
                summary["collectives"].append({"name": "all_reduce", "group": "0", "seq": step, "step": step,
                                               "start_us": arrivals[r] + shift, "end_us": end + shift,
                                               "bytes": 4 * 1024 * 1024})  # fmt: skip
            now = end
        return list(summaries.values())

    def _empty(self, rank: int, cycle_step: int) -> dict:
        return {"format": FORMAT, "version": VERSION, "rank": rank, "world_size": self.world_size,
                "host": self.host(rank), "cycle_step": cycle_step, "steps": [], "collectives": [], "device": None}


def cycles(job: Job, count: int = 2, steps_per_cycle: int = 8) -> list[list[dict]]:
    """`count` cycles of `steps_per_cycle` steps each, logged at steps 10, 20, ..."""
    return [job.cycle(10 * (c + 1), range(10 * c + 1, 10 * c + 1 + steps_per_cycle)) for c in range(count)]


def log_job(client, run_id: str, cycles_of_ranks: list[list[dict]], skip: set[int] = frozenset()) -> None:
    """Logs each summary as the rank would: `profiler/ranks/rank_<r>/cycle_<step>.json`, one upload
    per rank per cycle (ranks in `skip` send nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        for summaries in cycles_of_ranks:
            for summary in summaries:
                if summary["rank"] in skip:
                    continue
                path = Path(tmp, f"cycle_{summary['cycle_step']}.json")
                path.write_text(json.dumps(summary), encoding="utf-8")
                client.log_artifact(run_id, str(path), f"profiler/ranks/rank_{summary['rank']}")
