"""Which process group each gloo span of a chrome trace belongs to, from the trace alone (a prototype).

A gloo trace (torch 2.13) names no group on its collectives: `gloo:all_reduce` carries only its
input shapes, and the calling thread's `c10d::allreduce_` names nothing either (its process-group
argument is recorded as ""). What the trace does hold (docs/notes_gloo_groups.md):

- `distributedInfo.pg_config`: the rank's groups (only those it is a member of) in creation order;
- each gloo group runs its collectives on two threads of its own (`pt_gloo_runloop`, gloo's default
  `threads=2`, the only value `new_group` uses), started when the group is made; Linux thread ids
  grow with creation, so within one process the worker threads sort in pg_config order, two a group;
- a group whose threads ran nothing in the window has no thread in the trace at all (the default
  group when a job uses only subgroups), and a group that ran one collective shows one thread;
- `gloo:send` / `gloo:recv` run on the calling thread, starting inside `c10d::send` / `c10d::recv_`, whose
  third "Concrete Inputs" is the peer's rank within the group (recorded with record_shapes=True).

The rule, which never guesses within that model (its limits: docs/notes_gloo_groups.md):

`place_rank(trace)` (one rank): a worker thread's group is every group g that some assignment of the
sorted worker threads to pg_config allows, keeping creation order and at most two threads a group.
A thread is placed when only one g is possible (always when every group shows both threads), else
"cannot place" with the candidates. A send/recv is placed when one group only can hold its peer
index (a group big enough, where the index is not the rank itself).

`place_job(traces)` (every rank's trace of one job, keyed by rank): the same assignments per rank,
then pruned until they agree across ranks: for each group, its members' span sequences (per
profiler step both traces hold) must have the same length, names and shapes, and on one host the
k-th spans of an all_reduce-like collective must overlap (no member can finish before every member
has started). A thread is placed when every surviving assignment puts it in one group; no surviving
assignment means "cannot place". A send/recv keeps a candidate group only when the peer's trace
(if given) has the matching recv/send naming this rank's index in that group, in the same step.

Each function returns, per span, `(span, group index in pg_config or None, reason)`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping

THREADS_PER_GROUP = 2  # ProcessGroupGloo's default, and what new_group builds in torch 2.13
P2P = {"gloo:send": "c10d::send", "gloo:recv": "c10d::recv_"}
# Collectives where no member can finish before every member has started.
MEETING = {"gloo:all_reduce", "gloo:sparse_all_reduce", "gloo:barrier", "gloo:all_gather", "gloo:all_to_all",
           "gloo:reduce_scatter", "gloo:allgather_coalesced", "gloo:allreduce_coalesced"}  # fmt: skip
MAX_HYPOTHESES = 20000
INLINE = "cannot place: a collective on the calling thread (not seen in torch 2.13 gloo traces)"
STEP = re.compile(r"ProfilerStep#(\d+)$")


# ---------------------------------------------------------------- one rank's trace, read once


class RankView:
    """What the rule reads from one rank's trace."""

    def __init__(self, trace: dict) -> None:
        info = trace.get("distributedInfo") or {}
        self.rank = info.get("rank")
        self.host = trace.get("host_name")
        self.groups = [g for g in info.get("pg_config") or [] if "gloo" in str(g.get("backend_config", "gloo"))]
        self.index = {id(g): i for i, g in enumerate(info.get("pg_config") or [])}  # index in the full pg_config
        events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and isinstance(e.get("tid"), int)]
        callers = {e["tid"] for e in events if e["name"].startswith("c10d::")}
        self.gloo = sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
        self.p2p = [e for e in self.gloo if e["tid"] in callers and e["name"] in P2P]
        self.p2p_ids = {id(e) for e in self.p2p}
        self.inline_ids = {id(e) for e in self.gloo if e["tid"] in callers and e["name"] not in P2P}
        self.worker_spans = [e for e in self.gloo if e["tid"] not in callers]
        self.workers = sorted({e["tid"] for e in self.worker_spans})
        self.pid = next((e["pid"] for e in self.gloo if isinstance(e.get("pid"), int)), None)
        self.c10d = sorted((e for e in events if e["name"].startswith("c10d::")), key=lambda e: e["ts"])
        self.steps = sorted(((e["ts"], e["ts"] + e["dur"], int(STEP.match(e["name"]).group(1)))
                             for e in events if STEP.match(e["name"]) and e["tid"] in callers))  # fmt: skip

    def step_of(self, span: dict) -> int | None:
        for start, end, number in self.steps:
            if start <= span["ts"] <= end:
                return number
        return None

    def caller_op(self, span: dict) -> dict | None:
        """The c10d op on a calling thread that started last before the span."""
        before = [op for op in self.c10d if op["ts"] <= span["ts"]]
        if span["name"] in P2P:
            before = [op for op in before if op["tid"] == span["tid"]]
        return before[-1] if before else None

    def pg_index(self, g: int) -> int:
        """Index among gloo groups -> index in the trace's pg_config."""
        return self.index[id(self.groups[g])]


def _dims(span: dict):
    return repr(span.get("args", {}).get("Input Dims"))


def _peer(op: dict | None) -> int | None:
    try:
        return int(op["args"]["Concrete Inputs"][2])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


# ---------------------------------------------------------------- worker threads -> groups


def _tids_in_creation_order(view: RankView) -> str | None:
    """Why the worker threads' ids cannot stand for creation order, or None."""
    if view.pid is not None and any(t < view.pid for t in view.workers):
        return f"a worker thread id below the process id {view.pid} (ids wrapped?)"
    return None


def _assignments(n_threads: int, n_groups: int) -> list[tuple[int, ...]]:
    """Every way to give sorted threads to groups in creation order, at most two threads a group."""
    out: list[tuple[int, ...]] = []

    def walk(prefix: list[int], group: int, used: int) -> None:
        if len(out) > MAX_HYPOTHESES:
            return
        if len(prefix) == n_threads:
            out.append(tuple(prefix))
            return
        for g in range(group, n_groups):
            taken = used if g == group else 0
            if taken < THREADS_PER_GROUP:
                walk(prefix + [g], g, taken + 1)

    walk([], 0, 0)
    return out


def _thread_result(view: RankView, hypotheses: list[tuple[int, ...]], why_not: str | None, how: str):
    """tid -> (pg_config index or None, reason)."""
    out = {}
    for k, tid in enumerate(view.workers):
        if why_not:
            out[tid] = (None, f"cannot place: {why_not}")
            continue
        options = sorted({h[k] for h in hypotheses})
        if len(options) == 1:
            g = options[0]
            out[tid] = (view.pg_index(g), f"{how}: worker thread {k + 1} of {len(view.workers)} can only be "
                                          f"group {view.pg_index(g)} ({view.groups[g].get('pg_desc')})")  # fmt: skip
        else:
            names = [f"{view.pg_index(g)} ({view.groups[g].get('pg_desc')})" for g in options]
            out[tid] = (None, f"cannot place: worker thread {k + 1} of {len(view.workers)} could be group "
                              + " or ".join(names) if options else "cannot place: no assignment fits every rank")  # fmt: skip
    return out


def _single_rank_hypotheses(view: RankView) -> tuple[list[tuple[int, ...]], str | None]:
    if not view.groups:
        return [], "no gloo group in distributedInfo.pg_config"
    why = _tids_in_creation_order(view)
    if why:
        return [], why
    if len(view.workers) > THREADS_PER_GROUP * len(view.groups):
        return [], (f"{len(view.workers)} worker threads, more than the {len(view.groups)} gloo group(s) in pg_config "
                    f"can hold (a group gone from pg_config?)")
    hypotheses = _assignments(len(view.workers), len(view.groups))
    if len(hypotheses) > MAX_HYPOTHESES:
        return [], "too many ways to assign the threads"
    return hypotheses, None


# ---------------------------------------------------------------- send / recv


def _p2p_candidates(view: RankView, span: dict) -> tuple[list[int], int | None, str | None]:
    op = view.caller_op(span)
    if op is None or op["name"] != P2P[span["name"]]:
        return [], None, f"no {P2P[span['name']]} before it on its thread"
    peer = _peer(op)
    if peer is None:
        return [], None, f"{op['name']} records no peer (record_shapes off?)"
    fits = [g for g, cfg in enumerate(view.groups)
            if peer < len(cfg["ranks"]) and cfg["ranks"][peer] != view.rank and view.rank in cfg["ranks"]]  # fmt: skip
    return fits, peer, None


def _p2p_result(view: RankView, span: dict, fits: list[int], peer: int | None, why: str | None, how: str):
    if why:
        return None, f"cannot place: {why}"
    if len(fits) == 1:
        g = fits[0]
        return view.pg_index(g), (f"{how}: peer index {peer} fits group {view.pg_index(g)} "
                                  f"({view.groups[g].get('pg_desc')}) only")  # fmt: skip
    names = [f"{view.pg_index(g)} ({view.groups[g].get('pg_desc')})" for g in fits]
    return None, (f"cannot place: peer index {peer} fits group " + " or ".join(names)) if fits else (
        f"cannot place: peer index {peer} fits no group")


# ---------------------------------------------------------------- the two rules


def place_rank(trace: dict) -> list[tuple[dict, int | None, str]]:
    """Every gloo span of one rank's trace, with its group's index in pg_config or None, and why."""
    view = RankView(trace)
    hypotheses, why = _single_rank_hypotheses(view)
    threads = _thread_result(view, hypotheses, why, "creation order")
    out = []
    for span in view.gloo:
        if id(span) in view.p2p_ids:
            fits, peer, why_p2p = _p2p_candidates(view, span)
            out.append((span, *_p2p_result(view, span, fits, peer, why_p2p, "peer index")))
        elif id(span) in view.inline_ids:
            out.append((span, None, INLINE))
        else:
            out.append((span, *threads[span["tid"]]))
    return out


def _key(cfg: dict) -> tuple:
    return tuple(cfg["ranks"])


def _sequences(view: RankView, hypothesis: tuple[int, ...]) -> dict[tuple, list[dict]]:
    """Group (by its ranks) -> its spans on this rank, in time order, under one assignment."""
    group_of = {tid: hypothesis[k] for k, tid in enumerate(view.workers)}
    seq: dict[tuple, list[dict]] = {_key(cfg): [] for cfg in view.groups}
    for span in view.worker_spans:
        seq[_key(view.groups[group_of[span["tid"]]])].append(span)
    return seq


def _agree(a: RankView, sa: list[dict], b: RankView, sb: list[dict], tol_us: float) -> bool:
    """Could these be the same group's collectives on two of its members?"""
    if a.steps and b.steps:  # compare within the profiler steps both windows hold
        both = {n for _, _, n in a.steps} & {n for _, _, n in b.steps}
        sa = [s for s in sa if a.step_of(s) in both]
        sb = [s for s in sb if b.step_of(s) in both]
    if len(sa) != len(sb):
        return False
    same_host = a.host is not None and a.host == b.host
    for x, y in zip(sa, sb):
        if x["name"] != y["name"] or _dims(x) != _dims(y):
            return False
        if a.steps and b.steps and a.step_of(x) != b.step_of(y):
            return False
        if same_host and x["name"] in MEETING and max(x["ts"], y["ts"]) > min(x["ts"] + x["dur"], y["ts"] + y["dur"]) + tol_us:
            return False
    return True


def place_job(traces: Mapping[int, dict], tol_us: float = 200.0) -> dict[int, list[tuple[dict, int | None, str]]]:
    """Every rank's gloo spans placed with what all the job's traces (keyed by rank) say together."""
    views = {r: RankView(t) for r, t in traces.items()}
    alive: dict[int, list[tuple[int, ...]]] = {}
    why: dict[int, str | None] = {}
    for r, v in views.items():
        alive[r], why[r] = _single_rank_hypotheses(v)
    seqs = {r: {h: _sequences(views[r], h) for h in alive[r]} for r in views}
    # which other ranks share a group with r (by the group's ranks)
    shared = {r: {q for q in views if q != r and any(_key(c) in {_key(d) for d in views[q].groups}
                                                     for c in views[r].groups)} for r in views}  # fmt: skip

    def supported(r: int, h: tuple[int, ...], q: int) -> bool:
        keys = {_key(c) for c in views[r].groups} & {_key(c) for c in views[q].groups}
        return any(all(_agree(views[r], seqs[r][h][k], views[q], seqs[q][hq][k], tol_us) for k in keys)
                   for hq in alive[q])  # fmt: skip

    changed = True
    while changed:
        changed = False
        for r in views:
            if why[r]:
                continue
            for q in shared[r]:
                if why[q]:
                    continue  # that rank's threads are unplaceable: it constrains nothing
                keep = [h for h in alive[r] if supported(r, h, q)]
                if len(keep) != len(alive[r]):
                    alive[r], changed = keep, True
    out: dict[int, list[tuple[dict, int | None, str]]] = {}
    for r, v in views.items():
        threads = _thread_result(v, alive[r], why[r], "creation order, checked against the other ranks")
        placed = []
        for span in v.gloo:
            if id(span) in v.p2p_ids:
                fits, peer, why_p2p = _p2p_candidates(v, span)
                if not why_p2p:
                    fits = [g for g in fits if _p2p_matched(views, v, span, v.groups[g], peer)]
                placed.append((span, *_p2p_result(v, span, fits, peer, why_p2p, "peer index, matched on the peer")))
            elif id(span) in v.inline_ids:
                placed.append((span, None, INLINE))
            else:
                placed.append((span, *threads[span["tid"]]))
        out[r] = placed
    return out


def _p2p_matched(views: Mapping[int, RankView], view: RankView, span: dict, cfg: dict, peer: int) -> bool:
    """Does the peer's trace (if given) hold the other end, naming this rank's index in `cfg`?"""
    other = views.get(cfg["ranks"][peer])
    if other is None:
        return True  # nothing to check against
    want = "gloo:recv" if span["name"] == "gloo:send" else "gloo:send"
    me = cfg["ranks"].index(view.rank)
    step = view.step_of(span)
    for s in other.p2p:
        if s["name"] == want and _dims(s) == _dims(span) and _peer(other.caller_op(s)) == me:
            if step is None or other.step_of(s) in (None, step):
                return True
    return False


# ---------------------------------------------------------------- checked against what the job issued


def score(placed: list[tuple[dict, int | None, str]], trace: dict, issued: list[dict]) -> dict:
    """Compare with the collectives a rank issued in order (tests/rank3d_worker.py's truth file):
    with synchronous collectives, the k-th gloo span in time is the k-th issued."""
    config = trace["distributedInfo"]["pg_config"]
    spans = sorted(placed, key=lambda p: p[0]["ts"])
    if len(spans) != len(issued):
        return {"error": f"{len(spans)} gloo spans, {len(issued)} issued"}
    counts = {"right": 0, "wrong": 0, "cannot": 0}
    wrong = []
    for (span, g, reason), want in zip(spans, issued):
        assert span["name"] == "gloo:" + want["op"], (span["name"], want)
        truth = next(i for i, c in enumerate(config) if c["ranks"] == want["ranks"])
        if g is None:
            counts["cannot"] += 1
        elif g == truth:
            counts["right"] += 1
        else:
            counts["wrong"] += 1
            wrong.append((span["name"], span["ts"], g, truth, reason))
    return {**counts, "wrong_spans": wrong}


def tids_by_truth(trace: dict, issued: list[dict]) -> dict[int, set[int]]:
    """Worker or calling thread -> the pg_config indices its spans truly belong to."""
    config = trace["distributedInfo"]["pg_config"]
    gloo = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and str(e.get("name")).startswith("gloo:")),
                  key=lambda e: e["ts"])  # fmt: skip
    out: dict[int, set[int]] = defaultdict(set)
    for span, want in zip(gloo, issued):
        out[span["tid"]].add(next(i for i, c in enumerate(config) if c["ranks"] == want["ranks"]))
    return dict(out)


