"""A 3D-parallel (TP x PP x DP) NCCL job's Kineto traces, one file per rank, with the ground truth they
were made from (for tests and benchmarks/).

    from rank3d import Job3D, generate
    truth = generate(Job3D(tp=2, pp=2, dp=2, slow_rank=3, clock_skew_ms=5), "out/")
    truth["straggler"]["rank"]            # 3
    truth["wait_us"]["3"][0]              # rank 3's true wait in each collective of the first step

    python tests/rank3d.py --tp 8 --pp 4 --dp 8 --out DIR [--slow-rank 37 --slow-ms 15] [--gz] ...

**Layout.** global rank = dp * (PP * TP) + pp * TP + tp (TP fastest, then PP, then DP: Megatron's and
NxD's order), so a TP group is TP consecutive ranks and sits inside a host when `ranks_per_node`
(default 32) is a multiple of TP. Host h holds ranks [h * ranks_per_node, (h + 1) * ranks_per_node),
named `node-000`, `node-001`, ...; its process ids are `4000 + 11 * local rank`, its device ids the
local rank. Groups: tp (same dp, pp), pp (same dp, tp), dp (same pp, tp), and the world (`default_pg`).

**The output folder** is what `torch.profiler.tensorboard_trace_handler(dir)` leaves on a shared
file system: one file per rank named `<host>_<pid>.<time_ns>.pt.trace.json` (`.gz` with `gzip`),
plus `truth.json`. `mlflow-neuron ingest DIR` takes it as it is (`_capture.ingest.find_cycles`: the
`*.pt.trace.json[.gz]` files, each placed by its `distributedInfo.rank`; truth.json is not a trace
name and is passed over). A missing rank has no file; a rank that died has a file with its first K
steps only.

**Each file** is what torch 2.13's profiler (Kineto) writes for an NCCL job: top-level keys in Kineto's
order (`schemaVersion`, `deviceProperties`, `distributedInfo`, `record_shapes`, `trace_id`,
`displayTimeUnit`, `baseTimeNanoseconds`, `traceEvents`, `traceName`). `distributedInfo` is torch's
`_get_distributed_info()`: backend, rank, world_size, pg_count, pg_config (the groups this rank
belongs to, in creation order: default_pg, tp, pp, dp; each {pg_name, pg_desc, backend_config,
pg_size, ranks}), nccl_version. Kineto writes no host name (`host_name` only with
`host_name_key=True`, for readers that look for it); the host is in the file name. Times: Kineto
writes `ts` in microseconds (ns precision) relative to `baseTimeNanoseconds`, the start of the
current 3-month interval (7,889,238 s), the same on every rank.

Per step: a `ProfilerStep#N` user_annotation; per compute op a `cpu_op`, its `cudaLaunchKernel`
(cat `cuda_runtime`) and its `kernel` on stream 7, linked by `correlation` (and `External id`); per
collective the c10d op (`c10d::allreduce_`, `c10d::send`, `c10d::recv_`), `record_param_comms` with
the arguments torch's `saveNcclMeta` writes (`Collective name` "allreduce"/"send"/"recv", `dtype`,
`In/Out msg nelems`, `In/Out split size`, `Global rank start/stride`, `Group size`, `Process Group
Name/Description/Ranks`, `Rank`, `Dst Rank` on a send, `Src Rank` on a recv, `Seq`, `Comms Id`, `Is
asynchronized op`), the `nccl:<op>` annotation, the launch, and the NCCL kernel
(`ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`, `ncclDevKernel_SendRecv(...)`) on the group's
stream. `kernel_args="all"` (default) copies every collective argument onto the kernel;
`kernel_args="legacy"` only those Kineto's output_json.cpp copies (not `Rank`, `Global rank
start/stride`, `Seq`, `Comms Id`): a reader must then go through the launch to `record_param_comms`.

torch's rules reproduced:
- `Process Group Ranks` is the list start + i * stride (i < size), cut short past 30 ranks: the first
  29, `...`, the last (`"[0, 1, ..., 28, ..., 63]"`, torch/csrc/profiler/util.cpp `format_list`,
  kTruncateLength = 30). `ranks_cut="old"`: torch before the Seq/Comms Id era, the first 30 then
  `...`.
- `Seq` counts per group and rank from 1; collectives and point-to-point ops count separately (the
  pp group's sends and recvs share one count, so a pair's two ends rarely have the same Seq).
- `Rank` on a send/recv is the peer's rank in the group; `Dst Rank`/`Src Rank` its global rank.
- Group names (`group_names="per_rank"`, default): as with NxD, which creates groups on their members
  only, each rank numbers the groups it creates itself; before the 3D groups it made (and destroyed)
  `rank % 7` helper groups, so one group has different names on its members, and one name stands for
  different groups on different ranks: match on members. `group_names="global"`: torch's default
  (every rank calls new_group for every group): names are global creation counters ("0" the world,
  then every tp group, pp group, dp group), the same on every member.

**Schedule** (a step, GPipe): each stage runs the forward of M microbatches (recv activations from the
previous stage, then per layer a compute kernel and a TP all_reduce, then send to the next stage),
then their backward in the other direction (recv grads from the next stage, per layer compute + TP
all_reduce, send to the previous), then the DP all_reduce (gradients), the world all_reduce (loss,
`world_allreduce`), and the optimizer.

**Timing model**, in true time (microseconds), simulated event by event, all ranks of a stage at once
(NumPy over dp x tp): compute takes its length x (1 + jitter); a collective starts on each member
when it arrives (its previous kernel done) and ends on every member at the latest arrival + the
transfer (latency + a ring all_reduce's 2 (n-1)/n bytes, or a p2p's bytes, over NVLink-like bandwidth
inside a host and network bandwidth across hosts, x (1 + small jitter)); a send/recv pair ends on
both at max(recv posted, send started) + transfer. The slow rank's compute before each TP all_reduce
(`slow_mode="each"`) or before its first one of a step (`"once"`) takes `slow_ms` longer; the rest
follows from the model (its TP peers wait, then its stage's neighbours and its DP groups). Each
rank's clock = true time + its host's offset (`clock_skew_ms`: uniform in +-clock_skew_ms per host;
`host_offsets_ms` sets hosts explicitly); its host and device events are on that one clock (Kineto
aligns them). On the host, each op's events end just before its kernel starts.

**Truth** (`generate` returns it and writes `truth.json`): layout, steps, the straggler (rank, its TP
group, stage, host) or None, host offsets, missing and truncated ranks, every rank's group names, the
collectives of each stage in order, and each rank's true wait per step in each of its collectives
(latest arrival - own arrival, true time; send and recv count as a two-member collective) with their
sums per group kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT, VERSION = "mlflow-neuron/rank3d-truth", 1
THREE_MONTHS_S = 7_889_238  # Kineto's ChromeTraceBaseTime: ts relative to the start of a 3-month interval
BASE_NS = (1_796_000_000 // THREE_MONTHS_S) * THREE_MONTHS_S * 1_000_000_000  # late 2026
T0_US = 3 * 86_400e6 + 1_234_567.0  # the job starts 3 days into the interval
TRUNCATE_AT = 30  # torch's kTruncateLength
KINDS = ("tp", "pp", "dp", "world")
STREAM = {"compute": 7, "tp": 20, "pp": 24, "dp": 28, "world": 32}
NCCL_VERSION = "2.27.5"
_TIME, _DUR, _INT = "%%.3f", "%%.3f", "%%d"  # number slots, after a rank's constants are filled in


@dataclass
class Job3D:
    """The job; every field has a default (`Job3D(tp=8, pp=4, dp=8)`)."""

    tp: int = 2
    pp: int = 2
    dp: int = 2
    steps: int = 6
    first_step: int = 10  # ProfilerStep numbers start here (the profiler's wait + warmup before)
    microbatches: int = 4
    layers: int = 2  # compute + TP all_reduce pairs per microbatch, forward and backward each
    ranks_per_node: int = 32
    seed: int = 0
    # timing (microseconds)
    fwd_us: float = 1_500.0
    bwd_us: float = 3_000.0
    optimizer_us: float = 2_000.0
    step_gap_us: float = 300.0  # host work before a step's first kernel (data loading)
    jitter: float = 0.02  # compute lengths vary by up to this fraction, seeded
    comm_jitter: float = 0.01
    act_nelems: int = 4096 * 2048  # TP all_reduce and p2p message (bf16)
    grad_nelems: int = 25_000_000  # DP all_reduce bucket (bf16)
    nvlink_bytes_per_us: float = 150e3
    network_bytes_per_us: float = 25e3
    # what to plant
    slow_rank: int | None = None
    slow_ms: float = 15.0
    slow_mode: str = "each"  # "each": before every TP all_reduce of a step; "once": before the first
    clock_skew_ms: float = 0.0
    host_offsets_ms: dict[int, float] = field(default_factory=dict)  # host index -> offset, overrides
    missing_ranks: tuple[int, ...] = ()
    died_after: dict[int, int] = field(default_factory=dict)  # rank -> steps its file keeps
    # format
    world_allreduce: bool = True
    group_names: str = "per_rank"  # or "global"
    kernel_args: str = "all"  # or "legacy"
    ranks_cut: str = "new"  # or "old"
    gzip: bool = False
    gzip_level: int = 1
    flows: bool = False  # Kineto's ac2g flow events (launch -> kernel)
    host_name_key: bool = False

    def __post_init__(self):
        if min(self.tp, self.pp, self.dp, self.steps, self.microbatches, self.layers, self.ranks_per_node) < 1:
            raise ValueError("tp, pp, dp, steps, microbatches, layers, ranks_per_node must be >= 1")
        if self.slow_rank is not None and not 0 <= self.slow_rank < self.world_size:
            raise ValueError(f"slow_rank {self.slow_rank} is not a rank of {self.world_size}")
        if self.slow_mode not in ("each", "once") or self.group_names not in ("per_rank", "global") \
                or self.kernel_args not in ("all", "legacy") or self.ranks_cut not in ("new", "old"):
            raise ValueError("slow_mode each|once, group_names per_rank|global, kernel_args all|legacy, ranks_cut new|old")
        bad = [r for r in (*self.missing_ranks, *self.died_after) if not 0 <= r < self.world_size]
        if bad or any(k < 1 for k in self.died_after.values()):
            raise ValueError(f"missing/died ranks must be ranks of the job, and a died rank keep >= 1 step: {bad}")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def hosts(self) -> int:
        return -(-self.world_size // self.ranks_per_node)

    def rank(self, dp: int, pp: int, tp: int) -> int:
        return dp * (self.pp * self.tp) + pp * self.tp + tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of a global rank."""
        return rank // (self.pp * self.tp), rank // self.tp % self.pp, rank % self.tp

    def host(self, rank: int) -> str:
        return f"node-{rank // self.ranks_per_node:03d}"

    def pid(self, rank: int) -> int:
        return 4000 + 11 * (rank % self.ranks_per_node)

    def group(self, kind: str, rank: int) -> tuple[int, int, int, int]:
        """(global rank start, stride, size, this rank's rank in it) of `rank`'s group of a kind."""
        d, p, t = self.coords(rank)
        if kind == "tp":
            return self.rank(d, p, 0), 1, self.tp, t
        if kind == "pp":
            return self.rank(d, 0, t), self.tp, self.pp, p
        if kind == "dp":
            return self.rank(0, p, t), self.pp * self.tp, self.dp, d
        return 0, 1, self.world_size, rank

    def members(self, kind: str, rank: int) -> list[int]:
        start, stride, size, _ = self.group(kind, rank)
        return [start + i * stride for i in range(size)]

    def group_name(self, kind: str, rank: int) -> str:
        """The name `rank` knows its group of a kind by (see the module's docstring)."""
        if kind == "world":
            return "0"
        if self.group_names == "per_rank":
            return str(1 + rank % 7 + ("tp", "pp", "dp").index(kind))
        d, p, t = self.coords(rank)
        n_tp, n_pp = self.dp * self.pp, self.dp * self.tp
        if kind == "tp":
            return str(1 + d * self.pp + p)
        if kind == "pp":
            return str(1 + n_tp + d * self.tp + t)
        return str(1 + n_tp + n_pp + p * self.tp + t)

    def pg_count(self, rank: int) -> int:
        created = 1 + self.dp * self.pp + self.dp * self.tp + self.pp * self.tp
        return created if self.group_names == "global" else 1 + rank % 7 + 3

    def host_offsets_us(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 7])
        offsets = rng.uniform(-1.0, 1.0, self.hosts) * self.clock_skew_ms * 1e3
        for host, ms in self.host_offsets_ms.items():
            offsets[int(host)] = ms * 1e3
        return offsets


def ranks_text(members: list[int], cut: str = "new") -> str:
    """`Process Group Ranks` as torch writes it (a string), cut short past 30 ranks."""
    if len(members) > TRUNCATE_AT:
        if cut == "new":
            return "[" + ", ".join(map(str, members[:TRUNCATE_AT - 1])) + f", ..., {members[-1]}]"
        return "[" + ", ".join(map(str, members[:TRUNCATE_AT])) + ", ...]"
    return "[" + ", ".join(map(str, members)) + "]"


# ---------------------------------------------------------------------------------------------------
# The schedule: each stage's ops of a step, in program order.


@dataclass(frozen=True)
class Op:
    kind: str  # "compute", "tp", "send", "recv", "dp", "world"
    phase: str  # "fwd", "bwd", "step" (dp, world, optimizer)
    microbatch: int | None = None
    layer: int | None = None
    peer: int | None = None  # the other stage of a send/recv

    @property
    def collective(self) -> bool:
        return self.kind != "compute"

    @property
    def group(self) -> str | None:
        return {"tp": "tp", "send": "pp", "recv": "pp", "dp": "dp", "world": "world"}.get(self.kind)


def stage_ops(job: Job3D, p: int) -> list[Op]:
    ops: list[Op] = []
    last = job.pp - 1
    for phase, prev, nxt in (("fwd", p - 1, p + 1), ("bwd", p + 1, p - 1)):
        for m in range(job.microbatches):
            if 0 <= prev <= last:
                ops.append(Op("recv", phase, m, peer=prev))
            for layer in range(job.layers):
                ops.append(Op("compute", phase, m, layer))
                if job.tp > 1:
                    ops.append(Op("tp", phase, m, layer))
            if 0 <= nxt <= last:
                ops.append(Op("send", phase, m, peer=nxt))
    if job.dp > 1:
        ops.append(Op("dp", "step"))
    if job.world_allreduce and job.world_size > 1:
        ops.append(Op("world", "step"))
    ops.append(Op("compute", "step"))  # the optimizer
    return ops


# ---------------------------------------------------------------------------------------------------
# The simulation, in true time.


@dataclass
class Simulation:
    """True times (microseconds). Per step s and stage p, arrays of shape (ops, dp, tp): `start`
    (kernel start = arrival), `end`, `latest` (a collective's latest arrival among its members; NaN
    for compute); `step_start` (steps, dp, pp, tp) is when each rank's step began."""

    ops: list[list[Op]]
    start: list[list[np.ndarray]]
    end: list[list[np.ndarray]]
    latest: list[list[np.ndarray]]
    step_start: np.ndarray
    finish: np.ndarray  # (dp, pp, tp): each rank's last kernel end


def _transfer_us(job: Job3D, nbytes: float, size: int, across_hosts: bool, ring: bool) -> float:
    bandwidth = job.network_bytes_per_us if across_hosts else job.nvlink_bytes_per_us
    if ring:
        return 10.0 + 5.0 * math.log2(max(size, 2)) + 2.0 * (size - 1) / size * nbytes / bandwidth
    return 8.0 + nbytes / bandwidth


def _spans_hosts(job: Job3D, kind: str) -> bool:
    """Whether some group of this kind has members on two hosts."""
    for rank in range(0, job.world_size, max(1, job.world_size // 64)):
        members = job.members(kind, rank)
        if members[0] // job.ranks_per_node != members[-1] // job.ranks_per_node:
            return True
    return False


def simulate(job: Job3D) -> Simulation:
    D, P, T = job.dp, job.pp, job.tp
    rng = np.random.default_rng(job.seed)
    ops = [stage_ops(job, p) for p in range(P)]
    xfer = {
        "tp": _transfer_us(job, 2 * job.act_nelems, T, _spans_hosts(job, "tp"), ring=True),
        "pp": _transfer_us(job, 2 * job.act_nelems, 2, _spans_hosts(job, "pp"), ring=False),
        "dp": _transfer_us(job, 2 * job.grad_nelems, D, _spans_hosts(job, "dp"), ring=True),
        "world": _transfer_us(job, 4, job.world_size, job.hosts > 1, ring=True),
    }
    slow = np.zeros((D, P, T))
    if job.slow_rank is not None:
        slow[job.coords(job.slow_rank)] = job.slow_ms * 1e3
    now = T0_US + rng.uniform(0.0, 50.0, (D, P, T))
    starts, ends, latests, step_start = [], [], [], np.empty((job.steps, D, P, T))

    def comm_time(kind: str, shape) -> np.ndarray:
        return xfer[kind] * (1.0 + job.comm_jitter * rng.uniform(-1.0, 1.0, shape))

    for s in range(job.steps):
        now += job.step_gap_us * (1.0 + job.jitter * rng.uniform(-1.0, 1.0, now.shape))
        step_start[s] = now
        S = [np.full((len(o), D, T), np.nan) for o in ops]
        E = [np.full((len(o), D, T), np.nan) for o in ops]
        L = [np.full((len(o), D, T), np.nan) for o in ops]
        ip = [0] * P
        slowed_once = [False] * P

        def record(p, i, start, end, latest=None):
            S[p][i], E[p][i] = start, end
            if latest is not None:
                L[p][i] = latest

        def ready(p: int) -> bool:
            op = ops[p][ip[p]]
            if op.kind in ("compute", "tp"):
                return True
            if op.kind == "send":
                q = op.peer
                return ip[q] < len(ops[q]) and ops[q][ip[q]] == Op("recv", op.phase, op.microbatch, peer=p)
            if op.kind == "recv":
                return False  # the sender completes the pair
            return all(ip[q] < len(ops[q]) and ops[q][ip[q]].kind == op.kind for q in range(P))  # dp, world

        def run(p: int) -> None:
            i, op = ip[p], ops[p][ip[p]]
            here = now[:, p, :]
            if op.kind == "compute":
                base = {"fwd": job.fwd_us, "bwd": job.bwd_us, "step": job.optimizer_us}[op.phase]
                length = base * (1.0 + job.jitter * rng.uniform(-1.0, 1.0, (D, T)))
                before_tp = i + 1 < len(ops[p]) and ops[p][i + 1].kind == "tp"
                if (before_tp or (job.tp == 1 and op.phase != "step")) and not slowed_once[p]:
                    length = length + slow[:, p, :]
                    slowed_once[p] = job.slow_mode == "once" and bool(slow[:, p, :].any())
                record(p, i, here.copy(), here + length)
                now[:, p, :] = here + length
                ip[p] += 1
            elif op.kind == "tp":
                latest = here.max(axis=1, keepdims=True)
                end = latest + comm_time("tp", (D, 1))
                record(p, i, here.copy(), np.broadcast_to(end, (D, T)), np.broadcast_to(latest, (D, T)))
                now[:, p, :] = end
                ip[p] += 1
            elif op.kind == "send":
                q = op.peer
                j = ip[q]
                posted = now[:, q, :].copy()
                latest = np.maximum(here, posted)
                end = latest + comm_time("pp", (D, T))
                record(p, i, here.copy(), end, latest)
                record(q, j, posted, end, latest)
                now[:, p, :] = end
                now[:, q, :] = end
                ip[p] += 1
                ip[q] += 1
            else:  # dp, world: every stage is at it
                arrival = now.copy()
                if op.kind == "dp":
                    latest = np.broadcast_to(arrival.max(axis=0, keepdims=True), arrival.shape)
                    end = latest + comm_time("dp", (1, P, T))
                else:
                    latest = np.full(arrival.shape, arrival.max())
                    end = latest + comm_time("world", ())
                for q in range(P):
                    record(q, ip[q], arrival[:, q, :], end[:, q, :], latest[:, q, :])
                    ip[q] += 1
                now[...] = end

        while any(ip[p] < len(ops[p]) for p in range(P)):
            moved = False
            for p in range(P):
                while ip[p] < len(ops[p]) and ready(p):
                    run(p)
                    moved = True
            if not moved:
                raise RuntimeError(f"the schedule deadlocks at step {s}: {[ops[p][ip[p]] for p in range(P)]}")
        starts.append(S)
        ends.append(E)
        latests.append(L)
    return Simulation(ops, starts, ends, latests, step_start, now.copy())


# ---------------------------------------------------------------------------------------------------
# The traces: a template per stage (numbers as slots), a rank's constants filled in once, then one
# `%` per step with that rank's numbers, computed for the whole stage at once.

_GEMM = {
    "fwd": ("aten::addmm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
            '"Input Dims":[[4096],[2048,4096],[4096,4096]],"Input type":["c10::BFloat16","c10::BFloat16","c10::BFloat16"]'),
    "bwd": ("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
            '"Input Dims":[[2048,4096],[4096,4096]],"Input type":["c10::BFloat16","c10::BFloat16"]'),
    "step": ("aten::_foreach_add_", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<c10::BFloat16, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<c10::BFloat16, 2, 2, 0>, std::plus<float>, float)",
             '"Input Dims":[[],[]],"Input type":["TensorList","TensorList"]'),
}  # fmt: skip
_NCCL_KERNEL = {"tp": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                "dp": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)",
                "world": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                "pp": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"}  # fmt: skip
_KERNEL_ARGS = ('"queued":0,"device":%(dev)s,"context":1,"stream":{stream},"correlation":' + _INT +
                ',"registers per thread":{regs},"shared memory":{smem},"blocks per SM":{bps},"warps per SM":{wps},'
                '"grid":[{grid},1,1],"block":[{block},1,1],"est. achieved occupancy %%%%":{occ}')  # fmt: skip
_COMPUTE_SHAPE = {"regs": 168, "smem": 213248, "bps": 1, "wps": 8, "grid": 132, "block": 384, "occ": 12}
_NCCL_SHAPE = {"regs": 96, "smem": 0, "bps": 0.242424, "wps": 4.848485, "grid": 32, "block": 640, "occ": 0}


class _Slots:
    """Number slots of a stage's step template: value = a * X[i] + b * X[j] + c (+ the rank's clock
    offset where `clock`) + step index * `per_step`. X holds the ops' starts (rows 0..n-1), ends
    (n..2n-1), the step's start and end (2n, 2n+1) and zeros (2n+2)."""

    def __init__(self, n_ops: int):
        self.n = n_ops
        self.i, self.j, self.a, self.b, self.c, self.clock, self.per_step, self.cid = ([] for _ in range(8))

    def add(self, i=None, j=None, a=0.0, b=0.0, c=0.0, clock=False, per_step=0.0, cid=None) -> None:
        zero = 2 * self.n + 2
        self.i.append(zero if i is None else i)
        self.j.append(zero if j is None else j)
        self.a.append(a), self.b.append(b), self.c.append(c), self.clock.append(clock)
        self.per_step.append(per_step), self.cid.append(cid)

    def time(self, row: int, lead: float) -> None:  # an absolute time: X[row] + lead
        self.add(i=row, a=1.0, c=lead, clock=True)

    def const(self, value: float, per_step: float = 0.0) -> None:
        self.add(c=value, per_step=per_step)

    def arrays(self):
        return (np.array(self.i), np.array(self.j), np.array(self.a), np.array(self.b), np.array(self.c),
                np.array(self.clock, bool), np.array(self.per_step))  # fmt: skip


@dataclass
class _StageTemplate:
    text: str  # `%(name)s` constants, `%%.3f` / `%%d` number slots
    slots: _Slots
    cid_slots: list[tuple[int, str, int, int]]  # (slot index, group kind, seq start, seq per step)


def _stage_template(job: Job3D, p: int, ops: list[Op]) -> _StageTemplate:
    """One step of a stage's events as text; the rank's constants are `%(...)s` names."""
    n = len(ops)
    slots, parts, cids = _Slots(n), [], []
    seq = {"tp": 0, "pp": 0, "dp": 0, "world": 0}
    per_step_seq = {kind: sum(1 for op in ops if op.group == kind) for kind in seq}
    ext = 1  # External ids of a step: ProfilerStep, then each op's
    corr = 1
    ext_per_step = 1 + sum(3 if op.collective else 1 for op in ops)
    corr_per_step = n
    ext0 = 1000 + job.first_step * ext_per_step
    corr0 = 50000 + job.first_step * corr_per_step

    def ext_slot(value):
        slots.const(ext0 + value, per_step=ext_per_step)

    def corr_slot(value):
        slots.const(corr0 + value, per_step=corr_per_step)

    # ProfilerStep#N
    parts.append('{"ph":"X","cat":"user_annotation","name":"ProfilerStep#' + _INT +
                 '","pid":%(pid)s,"tid":%(pid)s,"ts":' + _TIME + ',"dur":' + _DUR + ',"args":{"External id":' + _INT + '}},\n')
    slots.const(job.first_step, per_step=1.0)
    slots.time(2 * n, 0.0)
    slots.add(i=2 * n, j=2 * n + 1, a=-1.0, b=1.0)
    ext_slot(0)
    for k, op in enumerate(ops):
        start_row, end_row = k, n + k
        if op.kind == "compute":
            name, kernel, inputs = _GEMM[op.phase]
            parts.append('{"ph":"X","cat":"cpu_op","name":"' + name + '","pid":%(pid)s,"tid":%(pid)s,"ts":' + _TIME +
                         ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',' + inputs + '}},\n')
            slots.time(start_row, -14.0), slots.const(12.0), ext_slot(ext)
            parts.append('{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":%(pid)s,"tid":%(pid)s,"ts":' +
                         _TIME + ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',"cbid":211,"correlation":' +
                         _INT + '}},\n')
            slots.time(start_row, -10.0), slots.const(6.0), ext_slot(ext), corr_slot(corr)
            if job.flows:
                parts.append('{"ph":"s","id":' + _INT + ',"pid":%(pid)s,"tid":%(pid)s,"ts":' + _TIME +
                             ',"cat":"ac2g","name":"ac2g"},\n')
                corr_slot(corr), slots.time(start_row, -10.0)
            parts.append('{"ph":"X","cat":"kernel","name":"' + kernel.replace("%", "%%%%") + '","pid":%(dev)s,"tid":7,"ts":' +
                         _TIME + ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',' +
                         _KERNEL_ARGS.format(stream=7, **_COMPUTE_SHAPE) + '}},\n')
            slots.time(start_row, 0.0), slots.add(i=start_row, j=end_row, a=-1.0, b=1.0), ext_slot(ext), corr_slot(corr)
            if job.flows:
                parts.append('{"ph":"f","id":' + _INT + ',"pid":%(dev)s,"tid":7,"ts":' + _TIME +
                             ',"cat":"ac2g","name":"ac2g","bp":"e"},\n')
                corr_slot(corr), slots.time(start_row, 0.0)
            ext += 1
            corr += 1
            continue
        kind = op.group
        seq[kind] += 1
        if op.kind in ("send", "recv"):
            peer = "next" if op.peer == p + 1 else "prev"
            c10d, coll = ("c10d::send", "send") if op.kind == "send" else ("c10d::recv_", "recv")
            title = ("nccl:send %(pp_grank)s->%(" + peer + "_grank)s" if op.kind == "send"
                     else "nccl:recv %(pp_grank)s<-%(" + peer + "_grank)s")
            rank_arg = "%(" + peer + "_grank)s"
            p2p = (',"Dst Rank":%(' + peer + "_rank)s" if op.kind == "send" else ',"Src Rank":%(' + peer + "_rank)s")
            dtype, nelems, inputs = "BFloat16", job.act_nelems, '"Input Dims":[[2048,4096],[],[]],"Input type":["c10::BFloat16","Int","Int"]'
        else:
            c10d, coll, title, rank_arg, p2p = "c10d::allreduce_", "allreduce", "nccl:all_reduce", "%(" + kind + "_grank)s", ""
            dtype = "Float" if kind == "world" else "BFloat16"
            nelems = {"tp": job.act_nelems, "dp": job.grad_nelems, "world": 1}[kind]
            inputs = '"Input Dims":[[],[],[],[],[]],"Input type":["TensorList","","","","Int"]'
        common = ('"Collective name":"' + coll + '","dtype":"' + dtype + '","In msg nelems":' + str(nelems) +
                  ',"Out msg nelems":' + str(nelems) + ',"Group size":%(' + kind + '_size)s,"In split size":"[]",'
                  '"Out split size":"[]"')  # fmt: skip
        group = ',"Process Group Name":"%(' + kind + '_name)s","Process Group Description":"%(' + kind + '_desc)s"'
        ranks = ',"Process Group Ranks":"%(' + kind + '_ranks)s"'
        rank_fields = ',"Global rank start":%(' + kind + '_start)s,"Global rank stride":%(' + kind + '_stride)s,"Rank":' + rank_arg
        seq_fields = ',"Seq":' + _INT + ',"Comms Id":' + _INT
        seq_start = job.first_step * per_step_seq[kind] + seq[kind]

        def seq_slots():
            slots.const(seq_start, per_step=per_step_seq[kind])
            cids.append((len(slots.c), kind, seq_start, per_step_seq[kind]))
            slots.const(0.0)  # Comms Id: filled per rank

        parts.append('{"ph":"X","cat":"cpu_op","name":"' + c10d + '","pid":%(pid)s,"tid":%(pid)s,"ts":' + _TIME +
                     ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',' + inputs + '}},\n')
        slots.time(start_row, -40.0), slots.const(38.0), ext_slot(ext)
        parts.append('{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":%(pid)s,"tid":%(pid)s,"ts":' + _TIME +
                     ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',' + common + rank_fields + group + ranks +
                     p2p + seq_fields + ',"Is asynchronized op":0}},\n')
        slots.time(start_row, -38.0), slots.const(34.0), ext_slot(ext + 1)
        seq_slots()
        parts.append('{"ph":"X","cat":"user_annotation","name":"' + title + '","pid":%(pid)s,"tid":%(pid)s,"ts":' +
                     _TIME + ',"dur":' + _DUR + ',"args":{"External id":' + _INT + '}},\n')
        slots.time(start_row, -36.0), slots.const(30.0), ext_slot(ext + 2)
        parts.append('{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":%(pid)s,"tid":%(pid)s,"ts":' +
                     _TIME + ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',"cbid":211,"correlation":' +
                     _INT + '}},\n')
        slots.time(start_row, -20.0), slots.const(10.0), ext_slot(ext + 1), corr_slot(corr)
        if job.flows:
            parts.append('{"ph":"s","id":' + _INT + ',"pid":%(pid)s,"tid":%(pid)s,"ts":' + _TIME +
                         ',"cat":"ac2g","name":"ac2g"},\n')
            corr_slot(corr), slots.time(start_row, -20.0)
        stream = STREAM[kind]
        kernel_args = common + (rank_fields if job.kernel_args == "all" else "") + group + ranks + p2p
        parts.append('{"ph":"X","cat":"kernel","name":"' + _NCCL_KERNEL[kind] + '","pid":%(dev)s,"tid":' + str(stream) +
                     ',"ts":' + _TIME + ',"dur":' + _DUR + ',"args":{"External id":' + _INT + ',' +
                     _KERNEL_ARGS.format(stream=stream, **_NCCL_SHAPE) + ',' + kernel_args +
                     (seq_fields if job.kernel_args == "all" else "") + '}},\n')
        slots.time(start_row, 0.0), slots.add(i=start_row, j=end_row, a=-1.0, b=1.0), ext_slot(ext + 1), corr_slot(corr)
        if job.kernel_args == "all":
            seq_slots()
        if job.flows:
            parts.append('{"ph":"f","id":' + _INT + ',"pid":%(dev)s,"tid":' + str(stream) + ',"ts":' + _TIME +
                         ',"cat":"ac2g","name":"ac2g","bp":"e"},\n')
            corr_slot(corr), slots.time(start_row, 0.0)
        ext += 3
        corr += 1
    return _StageTemplate("".join(parts), slots, cids)


def _name_key(name: str, start: int, stride: int, size: int, p2p: bool) -> int:
    """Stands for c10::get_hash(pg name, ..., start, stride, size) in `Comms Id`: a number, below 2**53."""
    key = 0xCBF29CE484222325
    for byte in f"{name}|{int(p2p)}|{start}|{stride}|{size}".encode():
        key = ((key ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return key


def _comms_ids(keys: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Comms Ids of (ranks,) name keys and (slots,) sequence numbers: (ranks, slots), below 2**53."""
    with np.errstate(over="ignore"):
        mixed = keys[:, None] ^ (seqs[None, :].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        mixed = mixed * np.uint64(0xBF58476D1CE4E5B9)
    return (mixed >> np.uint64(11)).astype(np.float64)


def _rank_constants(job: Job3D, rank: int) -> dict:
    d, p, t = job.coords(rank)
    consts = {"pid": job.pid(rank), "dev": rank % job.ranks_per_node}
    for kind in KINDS:
        start, stride, size, grank = job.group(kind, rank)
        consts.update({f"{kind}_start": start, f"{kind}_stride": stride, f"{kind}_size": size, f"{kind}_grank": grank,
                       f"{kind}_name": job.group_name(kind, rank), f"{kind}_desc": kind if kind != "world" else "default_pg",
                       f"{kind}_ranks": ranks_text(job.members(kind, rank), job.ranks_cut)})  # fmt: skip
    consts.update(prev_grank=p - 1, next_grank=p + 1, prev_rank=rank - job.tp, next_rank=rank + job.tp)
    return consts


def _header(job: Job3D, rank: int, world_ranks: str) -> str:
    dev = rank % job.ranks_per_node
    configs = ['{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": %d, "ranks": %s}'
               % (job.world_size, world_ranks)]
    for kind in ("tp", "pp", "dp"):
        members = job.members(kind, rank)
        configs.append('{"pg_name": "%s", "pg_desc": "%s", "backend_config": "cuda:nccl", "pg_size": %d, "ranks": %s}'
                       % (job.group_name(kind, rank), kind, len(members), json.dumps(members)))
    info = ('{"backend": "nccl", "rank": %d, "world_size": %d, "pg_count": %d, "pg_config": [%s], "nccl_version": "%s"}'
            % (rank, job.world_size, job.pg_count(rank), ", ".join(configs), NCCL_VERSION))
    device = ('{"id": %d, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592, "computeMajor": 9, '
              '"computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, '
              '"warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536, '
              '"sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}' % dev)
    host = f'\n  "host_name": "{job.host(rank)}",' if job.host_name_key else ""
    return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    ' + device + '\n  ],\n  "distributedInfo": ' + info +
            ',\n  "record_shapes": 1,\n  "trace_id": "%032X",%s\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": %d,\n'
            '  "traceEvents": [\n' % ((rank + 1) * 0x9E3779B97F4A7C15 % (1 << 128), host, BASE_NS))  # fmt: skip


def _metadata_events(job: Job3D, rank: int, ts: float) -> str:
    pid, dev = job.pid(rank), rank % job.ranks_per_node
    events = [f'{{"name":"process_name","ph":"M","ts":{ts:.3f},"pid":{pid},"tid":0,"args":{{"name":"python3"}}}},',
              f'{{"name":"process_labels","ph":"M","ts":{ts:.3f},"pid":{pid},"tid":0,"args":{{"labels":"CPU"}}}},',
              f'{{"name":"process_name","ph":"M","ts":{ts:.3f},"pid":{dev},"tid":0,"args":{{"name":"python3"}}}},',
              f'{{"name":"process_labels","ph":"M","ts":{ts:.3f},"pid":{dev},"tid":0,"args":{{"labels":"GPU {dev}"}}}},',
              f'{{"name":"thread_name","ph":"M","ts":{ts:.3f},"pid":{pid},"tid":{pid},"args":{{"name":"thread {pid} (python3)"}}}},']
    for stream in sorted(set(STREAM.values())):
        events.append(f'{{"name":"thread_name","ph":"M","ts":{ts:.3f},"pid":{dev},"tid":{stream},"args":{{"name":"stream {stream}"}}}},')
    return "\n".join(events) + "\n"


def _footer(job: Job3D, rank: int, start: float, end: float, path: str) -> str:
    return ('{"ph":"X","cat":"Trace","ts":%.3f,"dur":%.3f,"pid":"Spans","tid":"PyTorch Profiler","name":"PyTorch Profiler (0)",'
            '"args":{"Op count":0}},\n{"name":"Iteration Start: PyTorch Profiler","ph":"i","s":"g","pid":"Traces",'
            '"tid":"Trace PyTorch Profiler","ts":%.3f},\n{"name":"Record Window End","ph":"i","s":"g","pid":"","tid":"",'
            '"ts":%.3f}\n  ],\n  "traceName": "%s"\n}\n' % (start, end - start, start, end, path))  # fmt: skip


def _write(job: Job3D, rank: int, out: Path, world_ranks: str, events: str, start: float, end: float) -> Path:
    """A rank's file, named as tensorboard_trace_handler names it: <host>_<pid>.<time_ns>.pt.trace.json[.gz]."""
    written_ns = BASE_NS + int(T0_US * 1e3) + 3_600_000_000_000 + 1_000 * rank  # an hour after the job started
    path = out / (f"{job.host(rank)}_{job.pid(rank)}.{written_ns}.pt.trace.json" + (".gz" if job.gzip else ""))
    data = (_header(job, rank, world_ranks) + _metadata_events(job, rank, start) + events +
            _footer(job, rank, start, end, str(path))).encode()  # fmt: skip
    if job.gzip:
        with gzip.open(path, "wb", compresslevel=job.gzip_level) as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def write_traces(job: Job3D, sim: Simulation, out: Path) -> dict[int, Path]:
    """One trace per rank under `out` (missing ranks: none); {rank: path}."""
    out.mkdir(parents=True, exist_ok=True)
    D, P, T = job.dp, job.pp, job.tp
    offsets_us = job.host_offsets_us()
    rank_of = np.arange(job.world_size).reshape(D, P, T)
    world_ranks = json.dumps(list(range(job.world_size)))
    texts: dict[int, list[str]] = {}
    paths: dict[int, Path] = {}
    missing = set(job.missing_ranks)
    kept_steps = {r: job.died_after.get(r, job.steps) for r in range(job.world_size)}
    for p in range(P):
        ops = sim.ops[p]
        n = len(ops)
        tmpl = _stage_template(job, p, ops)
        ii, jj, a, b, c, clock, per_step = tmpl.slots.arrays()
        ranks = rank_of[:, p, :].reshape(-1)
        offset = offsets_us[ranks // job.ranks_per_node]
        rank_tmpl = {}
        for r in ranks.tolist():
            if r not in missing:
                rank_tmpl[r] = tmpl.text % _rank_constants(job, r)
                texts[r] = []
        # Comms Ids: per rank (the group's name), per slot (the sequence number)
        cid_cols = [slot for slot, *_ in tmpl.cid_slots]
        cid_keys = {}
        for kind in KINDS:
            keys = []
            for r in ranks.tolist():
                start, stride, size, _ = job.group(kind, r)
                keys.append(_name_key(job.group_name(kind, r), start, stride, size, kind == "pp"))
            cid_keys[kind] = np.array(keys, dtype=np.uint64)
        for s in range(job.steps):
            first = sim.start[s][p][0].reshape(-1)
            step_start = first - 100.0
            if s + 1 < job.steps:
                step_end = sim.start[s + 1][p][0].reshape(-1) - 100.0
            else:
                step_end = sim.end[s][p][-1].reshape(-1) + 50.0
            X = np.concatenate([sim.start[s][p].reshape(n, -1), sim.end[s][p].reshape(n, -1),
                                step_start[None], step_end[None], np.zeros((1, len(ranks)))])  # fmt: skip
            N = (X[ii] * a[:, None] + X[jj] * b[:, None]).T + c + s * per_step
            N += offset[:, None] * clock
            N = np.round(N, 3)
            if cid_cols:
                for kind in KINDS:
                    cols = [(slot, seq0 + s * per) for slot, k, seq0, per in tmpl.cid_slots if k == kind]
                    if cols:
                        N[:, [col for col, _ in cols]] = _comms_ids(cid_keys[kind], np.array([q for _, q in cols]))
            for r, row in zip(ranks.tolist(), N.tolist()):
                if r in rank_tmpl and s < kept_steps[r]:
                    texts[r].append(rank_tmpl[r] % tuple(row))
        for r, o, first, last in zip(ranks.tolist(), offset.tolist(), sim.start[0][p][0].reshape(-1).tolist(),
                                     sim.finish[:, p, :].reshape(-1).tolist()):  # fmt: skip
            if r not in texts:
                continue
            if kept_steps[r] < job.steps:
                last = float(np.nanmax(sim.end[kept_steps[r] - 1][p][:, r // (P * T), r % T]))
            paths[r] = _write(job, r, out, world_ranks, "".join(texts.pop(r)), first - 400.0 + o, last + 100.0 + o)
    return paths


# ---------------------------------------------------------------------------------------------------
# The truth.


def truth_of(job: Job3D, sim: Simulation) -> dict:
    """The ground truth of a simulated job (JSON-ready)."""
    D, P, T = job.dp, job.pp, job.tp
    offsets = job.host_offsets_us()
    waits: dict[str, list[list[float]]] = {}
    by_kind: dict[str, list[dict]] = {}
    collectives: dict[str, list[dict]] = {}
    for p in range(P):
        ops = sim.ops[p]
        comm = [k for k, op in enumerate(ops) if op.collective]
        collectives[str(p)] = [{"kind": ops[k].kind, "group": ops[k].group, "phase": ops[k].phase,
                                "microbatch": ops[k].microbatch, "layer": ops[k].layer,
                                "peer_stage": ops[k].peer} for k in comm]  # fmt: skip
        kinds = np.array([ops[k].group for k in comm])
        for d in range(D):
            for t in range(T):
                r = job.rank(d, p, t)
                per_step, sums = [], []
                for s in range(job.steps):
                    w = (sim.latest[s][p][comm, d, t] - sim.start[s][p][comm, d, t]).round(3)
                    per_step.append(w.tolist())
                    sums.append({kind: round(float(w[kinds == kind].sum()), 3) for kind in KINDS})
                waits[str(r)] = per_step
                by_kind[str(r)] = sums
    straggler = None
    if job.slow_rank is not None:
        d, p, t = job.coords(job.slow_rank)
        straggler = {"rank": job.slow_rank, "slow_ms": job.slow_ms, "mode": job.slow_mode,
                     "tp_group": job.members("tp", job.slow_rank), "pp_stage": p, "dp_index": d, "tp_index": t,
                     "host": job.host(job.slow_rank)}  # fmt: skip
    steps = [job.first_step + s for s in range(job.steps)]
    return {
        "format": FORMAT, "version": VERSION,
        "layout": {"tp": T, "pp": P, "dp": D, "world_size": job.world_size, "ranks_per_node": job.ranks_per_node,
                   "rank": "dp * (pp_size * tp_size) + pp * tp_size + tp", "hosts": job.hosts},
        "options": {"steps": job.steps, "microbatches": job.microbatches, "layers": job.layers, "seed": job.seed,
                    "group_names": job.group_names, "kernel_args": job.kernel_args, "ranks_cut": job.ranks_cut,
                    "world_allreduce": job.world_allreduce, "schedule": "gpipe"},
        "steps": steps,
        "straggler": straggler,
        "host_offsets_us": {f"node-{h:03d}": round(float(o), 3) for h, o in enumerate(offsets)},
        "missing_ranks": sorted(job.missing_ranks),
        "truncated_ranks": {str(r): k for r, k in sorted(job.died_after.items())},
        "group_names": {str(r): {kind: job.group_name(kind, r) for kind in KINDS} for r in range(job.world_size)},
        "collectives": collectives,
        "wait_us": waits,
        "wait_us_by_kind": by_kind,
        "step_start_us": {str(job.rank(d, p, t)): [round(float(sim.step_start[s, d, p, t]), 3) for s in range(job.steps)]
                          for d in range(D) for p in range(P) for t in range(T)},
        "clock": "true time in microseconds since baseTimeNanoseconds; a rank's trace shows it + its host's offset",
    }  # fmt: skip


def generate(job: Job3D, out: str | Path, *, write_truth: bool = True) -> dict:
    """Simulates `job`, writes its traces under `out` (and truth.json); returns the truth, with
    `files` ({rank: path}) and `seconds` ({simulate, write, truth}) added."""
    out = Path(out)
    t0 = time.perf_counter()
    sim = simulate(job)
    t1 = time.perf_counter()
    files = write_traces(job, sim, out)
    t2 = time.perf_counter()
    truth = truth_of(job, sim)
    if write_truth:
        (out / "truth.json").write_text(json.dumps(truth, separators=(",", ":")), encoding="utf-8")
    t3 = time.perf_counter()
    truth["files"] = {r: str(path) for r, path in files.items()}
    truth["seconds"] = {"simulate": t1 - t0, "write": t2 - t1, "truth": t3 - t2}
    return truth


def _pairs(values: list[str], what: str) -> dict[int, float]:
    pairs = {}
    for value in values:
        key, _, number = value.partition("=")
        if not number:
            raise SystemExit(f"{what}: expected KEY=VALUE, got {value!r}")
        pairs[int(key)] = float(number)
    return pairs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Writes a TP x PP x DP NCCL job's Kineto traces (one per rank) and truth.json.")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--first-step", type=int, default=10)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--slow-ms", type=float, default=15.0)
    parser.add_argument("--slow-mode", choices=("each", "once"), default="each")
    parser.add_argument("--clock-skew-ms", type=float, default=0.0)
    parser.add_argument("--host-offset", action="append", default=[], metavar="HOST=MS",
                        help="a host's clock offset (host index), e.g. 3=-12.5; repeatable")
    parser.add_argument("--missing-rank", type=int, action="append", default=[])
    parser.add_argument("--died-after", action="append", default=[], metavar="RANK=STEPS",
                        help="the rank's file keeps only its first STEPS steps; repeatable")
    parser.add_argument("--no-world-allreduce", action="store_true")
    parser.add_argument("--group-names", choices=("per_rank", "global"), default="per_rank")
    parser.add_argument("--kernel-args", choices=("all", "legacy"), default="all")
    parser.add_argument("--ranks-cut", choices=("new", "old"), default="new")
    parser.add_argument("--gz", action="store_true")
    parser.add_argument("--flows", action="store_true")
    parser.add_argument("--host-name-key", action="store_true")
    args = parser.parse_args(argv)
    job = Job3D(tp=args.tp, pp=args.pp, dp=args.dp, steps=args.steps, first_step=args.first_step,
                microbatches=args.microbatches, layers=args.layers, ranks_per_node=args.ranks_per_node, seed=args.seed,
                slow_rank=args.slow_rank, slow_ms=args.slow_ms, slow_mode=args.slow_mode,
                clock_skew_ms=args.clock_skew_ms, host_offsets_ms=_pairs(args.host_offset, "--host-offset"),
                missing_ranks=tuple(args.missing_rank),
                died_after={r: int(k) for r, k in _pairs(args.died_after, "--died-after").items()},
                world_allreduce=not args.no_world_allreduce, group_names=args.group_names, kernel_args=args.kernel_args,
                ranks_cut=args.ranks_cut, gzip=args.gz, flows=args.flows, host_name_key=args.host_name_key)  # fmt: skip
    truth = generate(job, args.out)
    size = sum(Path(p).stat().st_size for p in truth["files"].values())
    secs = truth["seconds"]
    print(f"{len(truth['files'])} traces ({job.world_size} ranks: tp {job.tp} x pp {job.pp} x dp {job.dp}), "
          f"{size / 1e6:,.1f} MB, in {sum(secs.values()):.1f} s (simulate {secs['simulate']:.2f}, write "
          f"{secs['write']:.2f}, truth {secs['truth']:.2f}) -> {args.out}")  # fmt: skip
    if truth["straggler"]:
        print(f"straggler: rank {truth['straggler']['rank']}, tp group {truth['straggler']['tp_group']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
