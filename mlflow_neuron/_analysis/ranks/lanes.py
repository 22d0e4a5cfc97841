"""Which process group each gloo collective belongs to, from what every rank's summary holds (pure).

Gloo (torch 2.13) writes no group on its spans. What a trace does hold (docs/ranks.md, "Gloo"):
- `distributedInfo.pg_config` lists the rank's own groups in creation order (a summary's `groups`);
- each gloo group runs its collectives on two worker threads of its own, started when the group is
  made: within one process the worker threads (a collective's `lane`) sort in creation order, at
  most two a group; a group that ran nothing in the window shows no thread;
- send/recv run on the calling thread, and the c10d op that called them names the peer's rank
  within the group (`peer_index`, where shapes were recorded).

The rule never guesses: every way to give a rank's sorted worker threads to its groups in order
(at most two a thread group) is a hypothesis; the hypotheses are pruned until the ranks agree
(for each group two ranks share, their collectives under it have the same names, sizes and steps
and, on one host, the k-th synchronizing ones overlap in time). A thread is placed when every
surviving hypothesis puts it in one group. A send/recv is placed when one group only holds its
peer index and, where the peer reported, the peer holds the other end naming this rank. What is
not placed stays without members, and `matching` says why.
"""

from __future__ import annotations

import copy

from .clocks import SYNCHRONIZING

THREADS_PER_GROUP = 2  # ProcessGroupGloo's default, and what new_group builds in torch 2.13
MAX_HYPOTHESES = 20_000
OVERLAP_SLACK_US = 200.0


def place(by_rank: dict[int, list[dict]]) -> dict[int, list[dict]]:
    """The summaries with `members` (and a send's or receive's `peer`) filled in where the rule
    places a gloo collective; summaries that need nothing are returned as they are."""
    views = {r: _View(r, summaries) for r, summaries in by_rank.items() if _loose(summaries)}
    views = {r: v for r, v in views.items() if v.needs}
    if not views:
        return by_rank
    alive = {r: v.hypotheses() for r, v in views.items()}
    changed = True
    while changed:
        changed = False
        for r, v in views.items():
            for q, w in views.items():
                if q == r or not alive[q] or not (v.keys & w.keys):
                    continue
                keep = [h for h in alive[r] if any(_agree(v, h, w, hq) for hq in alive[q])]
                if len(keep) != len(alive[r]):
                    alive[r], changed = keep, True
    out = dict(by_rank)
    for r, v in views.items():
        out[r] = v.placed(alive[r], views)
    return out


class _View:
    """One rank's gloo collectives and groups, over its cycles."""

    def __init__(self, rank: int, summaries: list[dict]):
        self.rank, self.summaries = rank, summaries
        first = next((s for s in summaries if isinstance(s.get("groups"), list)), {})
        self.groups = [g for g in first.get("groups") or [] if isinstance(g, dict) and g.get("ranks")]
        self.keys = {tuple(g["ranks"]) for g in self.groups}
        self.host = next((s.get("host") for s in summaries if s.get("host")), None)
        self.steps = {st.get("step") for s in summaries for st in s.get("steps") or [] if isinstance(st, dict)}
        self.pid = next((s.get("pid") for s in summaries if isinstance(s.get("pid"), int)), None)
        records = [c for s in summaries for c in s.get("collectives") or [] if isinstance(c, dict)]
        self.workers = sorted({c["lane"] for c in records if c.get("members") is None and isinstance(c.get("lane"), int)})
        self.p2p = [c for c in records if c.get("peer") is None and isinstance(c.get("peer_index"), int)]
        self.needs = len(self.groups) > 1 and bool(self.workers or self.p2p)
        self.spans = sorted((c for c in records if c.get("lane") in self.workers and c.get("members") is None),
                            key=lambda c: c.get("start_us", 0.0))  # fmt: skip

    def hypotheses(self) -> list[tuple[int, ...]]:
        if self.pid is not None and any(t < self.pid for t in self.workers):
            return []  # thread ids wrapped: their order is not creation order
        if len(self.workers) > THREADS_PER_GROUP * len(self.groups):
            return []
        out: list[tuple[int, ...]] = []

        def walk(prefix: list[int], group: int, used: int) -> None:
            if len(out) > MAX_HYPOTHESES:
                return
            if len(prefix) == len(self.workers):
                out.append(tuple(prefix))
                return
            for g in range(group, len(self.groups)):
                taken = used if g == group else 0
                if taken < THREADS_PER_GROUP:
                    walk(prefix + [g], g, taken + 1)

        walk([], 0, 0)
        return out if len(out) <= MAX_HYPOTHESES else []

    def sequence(self, hypothesis: tuple[int, ...], key: tuple) -> list[dict]:
        lane_group = {lane: tuple(self.groups[g]["ranks"]) for lane, g in zip(self.workers, hypothesis)}
        return [c for c in self.spans if lane_group.get(c["lane"]) == key]

    def placed(self, alive: list[tuple[int, ...]], views: dict) -> list[dict]:
        lane_members = {}
        for k, lane in enumerate(self.workers):
            options = {h[k] for h in alive}
            if len(options) == 1:
                lane_members[lane] = self.groups[options.pop()]["ranks"]
        out = []
        for summary in self.summaries:
            summary = copy.copy(summary)
            summary["collectives"] = [self._with_group(c, lane_members, views) if isinstance(c, dict) else c
                                      for c in summary.get("collectives") or []]  # fmt: skip
            out.append(summary)
        return out

    def _with_group(self, c: dict, lane_members: dict, views: dict) -> dict:
        if c.get("members") is not None or c.get("unplaced"):  # its summary says why it has no group
            return c
        if c.get("lane") in lane_members:
            ranks = lane_members[c["lane"]]
            return {**c, "members": ranks, "desc": c.get("desc") or _desc(self.groups, ranks)}
        if c.get("peer") is None and isinstance(c.get("peer_index"), int):
            fits = [g for g in self.groups if self._p2p_fits(c, g, views)]
            if len(fits) == 1:
                ranks = fits[0]["ranks"]
                return {**c, "members": ranks, "desc": c.get("desc") or fits[0].get("desc"),
                        "peer": ranks[c["peer_index"]]}  # fmt: skip
        return c

    def _p2p_fits(self, c: dict, group: dict, views: dict) -> bool:
        ranks, i = group["ranks"], c["peer_index"]
        if not (0 <= i < len(ranks)) or ranks[i] == self.rank or self.rank not in ranks:
            return False
        other = views.get(ranks[i])
        if other is None:
            return True  # the peer needs no placing or did not report: nothing to check against
        want = "recv" if "send" in c["name"].lower() else "send"
        me = ranks.index(self.rank)
        return any(want in o["name"].lower() and o.get("peer_index") == me and o.get("bytes") == c.get("bytes")
                   and (c.get("step") is None or o.get("step") in (None, c.get("step"))) for o in other.p2p)  # fmt: skip


def _agree(v: _View, h: tuple[int, ...], w: _View, hq: tuple[int, ...]) -> bool:
    """Could these be the same groups' collectives on both ranks, under these hypotheses?"""
    same_host = v.host is not None and v.host == w.host
    for key in v.keys & w.keys:
        a, b = v.sequence(h, key), w.sequence(hq, key)
        steps = v.steps & w.steps  # the profiler steps both windows hold
        a = [c for c in a if c.get("step") in steps]
        b = [c for c in b if c.get("step") in steps]
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if x["name"] != y["name"] or x.get("bytes") != y.get("bytes") or x.get("step") != y.get("step"):
                return False
            if same_host and SYNCHRONIZING.search(x["name"]) and \
                    max(x["start_us"], y["start_us"]) > min(x["end_us"], y["end_us"]) + OVERLAP_SLACK_US:
                return False
    return True


def _loose(summaries: list[dict]) -> bool:
    """Whether a rank lists several groups and has a collective without members (gloo's)."""
    return any(isinstance(s.get("groups"), list) and len(s["groups"]) > 1
               and any(isinstance(c, dict) and c.get("members") is None for c in s.get("collectives") or [])
               for s in summaries)  # fmt: skip


def _desc(groups: list[dict], ranks: list[int]) -> str | None:
    return next((g.get("desc") for g in groups if g["ranks"] == ranks), None)
