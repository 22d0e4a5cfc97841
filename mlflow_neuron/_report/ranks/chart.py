"""The rank picture: per rank, its step split into compute, collective (not waiting), wait and idle.

One horizontal bar per rank (rank 0 at the top), its length the rank's mean step, split into
parts that add up to it, so that bars can be compared by length and by part. Means, not medians:
the medians of parts do not add up to the median step, and a picture whose parts do not add up
misleads. The straggler's label says so. Per step, a rank's step is

    compute | collective, not waiting | wait | idle | other

where compute is the time compute ran, collective the exposed communication (collective time
not overlapped by compute), the wait the part of it spent before the last rank arrived, idle the
time nothing ran, and other the rest of the step (host work that is neither: copies, Python).
A wait that overlapped compute (a device's collective kernel beside compute kernels) cannot be
drawn inside the exposed part; it is drawn as compute and the picture says how much there was.
Each part's artists carry `gid` "rank <r>: <part>", so a test can find what was drawn where.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

PARTS = ("compute", "collective, not waiting", "wait", "idle", "other")
COLORS = {"compute": "#4c78a8", "collective, not waiting": "#72b7b2", "wait": "#e45756", "idle": "#bab0ac",
          "other": "#eeca3b"}  # fmt: skip
_RANK_INCHES = 0.28
_VISIBLE = 0.002  # of the longest bar: "other" or overlapped wait this small is rounding, not named


def step_split(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, from `RankReport.steps` (one row per rank and step): the mean per step of each part
    (microseconds), `step_us` (their sum: the mean span the breakdown covers, `window_us`) and
    `wait_overlapped_us` (wait that overlapped compute)."""
    rows = []
    for rank, own in steps.groupby("rank", sort=True):
        mean = {k: float(pd.to_numeric(own[k], errors="coerce").fillna(0).mean())
                for k in ("window_us", "compute_us", "exposed_comm_us", "idle_us", "wait_us")}  # fmt: skip
        drawn_wait = min(max(mean["wait_us"], 0.0), mean["exposed_comm_us"])
        other = max(mean["window_us"] - mean["compute_us"] - mean["exposed_comm_us"] - mean["idle_us"], 0.0)
        rows.append({"rank": int(rank), "host": own["host"].iloc[0], "compute": mean["compute_us"],
                     "collective, not waiting": mean["exposed_comm_us"] - drawn_wait, "wait": drawn_wait,
                     "idle": mean["idle_us"], "other": other,
                     "wait_overlapped_us": max(mean["wait_us"] - drawn_wait, 0.0)})  # fmt: skip
    frame = pd.DataFrame(rows, columns=["rank", "host", *PARTS, "wait_overlapped_us"])
    frame["step_us"] = frame[list(PARTS)].sum(axis=1)
    return frame


def png(split: pd.DataFrame, path: Path, title: str, straggler: int | None = None) -> Path:
    """Writes the picture to `path` (Agg: no window)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig = figure(split, title, straggler)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(split: pd.DataFrame, title: str, straggler: int | None = None):
    import matplotlib.pyplot as plt

    count = len(split)
    fig, ax = plt.subplots(figsize=(9, 2.2 + _RANK_INCHES * count))
    ys = list(range(count))
    left = [0.0] * count
    longest = max(split["step_us"].max() if count else 0.0, 1e-3)
    for part in PARTS:
        widths = [v / 1000 for v in split[part]]
        shown = part != "other" or max(split[part], default=0.0) > _VISIBLE * longest  # "other" only where seen
        bars = ax.barh(ys, widths, left=left, color=COLORS[part], label=part if shown else None, height=0.75)
        for bar, rank in zip(bars, split["rank"]):
            bar.set_gid(f"rank {rank}: {part}")
        left = [a + b for a, b in zip(left, widths)]
    several_hosts = split["host"].nunique() > 1
    few = count <= 16
    labels = [f"rank {r}" + (f" ({h})" if h and few and several_hosts else "") +
              (" \u2190 straggler" if r == straggler else "") for r, h in zip(split["rank"], split["host"])]  # fmt: skip
    ax.set_yticks(ys, labels, fontsize=8 if few else 6)
    for tick, rank in zip(ax.get_yticklabels(), split["rank"]):
        if rank == straggler:
            tick.set_fontweight("bold")
            tick.set_color(COLORS["wait"])
    ax.set_ylim(count - 0.5, -0.5)  # rank 0 at the top
    if several_hosts and not few:
        _host_bands(ax, split)
    ax.set_xlabel("mean time per step (ms)")
    ax.set_xlim(0, longest / 1000 * 1.05)
    ax.legend(fontsize=8, ncols=len(PARTS), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    overlapped = split[split["wait_overlapped_us"] > _VISIBLE * longest]
    note = ""
    if len(overlapped):
        note = ("\nwait that overlapped compute, drawn as compute: " +
                ", ".join(f"rank {r} {v / 1000:.1f} ms" for r, v in zip(overlapped["rank"], overlapped["wait_overlapped_us"])))
    single = "" if several_hosts or not count else f" All on host {split['host'].iloc[0]}."
    ax.set_title("\n".join(textwrap.wrap(title + single, 95)) + note, fontsize=9, pad=28)
    fig.tight_layout()
    return fig


def _host_bands(ax, split: pd.DataFrame) -> None:
    """Many ranks: a line between hosts, and each host's name beside its ranks."""
    hosts = list(split["host"])
    start = 0
    for i in range(1, len(hosts) + 1):
        if i == len(hosts) or hosts[i] != hosts[start]:
            if i < len(hosts):
                ax.axhline(i - 0.5, color="#555", linewidth=0.6, linestyle=":")
            ax.text(1.005, (start + i - 1) / 2, str(hosts[start]), transform=ax.get_yaxis_transform(), fontsize=6,
                    va="center", ha="left")  # fmt: skip
            start = i


HEAT_MAP_FROM = 65  # ranks: from here a heat map, not a bar a rank


def rank_picture(read, path: Path) -> Path:
    """A `RankRead`'s picture: each rank's step split into compute, collective, wait, idle; from
    `HEAT_MAP_FROM` ranks, the wait a step as a heat map of node x local rank."""
    report = read.report
    straggler = (report.straggler or {}).get("rank")
    title = f"run {read.run_id}: {report.world_size} rank(s). {report.sentence.rstrip('.')}."
    if len(report.table) >= HEAT_MAP_FROM:
        return heat_map_png(report.table, path, title, report.straggler)
    return png(step_split(report.steps), path, title, straggler)


def heat_grid(table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The wait a step (collectives and receives, median, ms) of each rank as a grid: a row per
    host and a column per local rank (its place among the host's ranks) where the ranks name two
    hosts or more; else a row per 32 ranks. Returns the grid (NaN where no rank) and the rows' name."""
    t = table.assign(wait_ms=(pd.to_numeric(table["wait_us"], errors="coerce").fillna(0.0)
                              + pd.to_numeric(table["bubble_us"], errors="coerce").fillna(0.0)) / 1000).sort_values("rank")
    if t["host"].nunique() > 1:
        t["row"] = t["host"].astype(str)
        t["col"] = t.groupby("row").cumcount()
        name = "host"
    else:
        t["row"] = (t["rank"] // 32 * 32).map(lambda r: f"ranks {r}-{r + 31}")
        t["col"] = t["rank"] % 32
        name = "32 ranks a row (the traces name no host)"
    order = list(dict.fromkeys(t["row"]))
    return t.pivot_table(index="row", columns="col", values="wait_ms", aggfunc="first").reindex(order), name


def heat_map_png(table: pd.DataFrame, path: Path, title: str, straggler: dict | None) -> Path:
    """Writes the heat map (Agg); the straggler's cell boxed, its group's cells outlined."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    grid, rows = heat_grid(table)
    fig, ax = plt.subplots(figsize=(10, max(4.5, 2.5 + 0.12 * len(grid))))
    cmap = matplotlib.colormaps["magma_r"].copy()
    cmap.set_bad("#9e9e9e")  # a rank that sent no summary
    image = ax.imshow(grid.to_numpy(float), aspect="auto", cmap=cmap, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="wait a step, ms (median; collectives + receives)")
    where = _cells(table, grid)
    if straggler:
        for r in straggler.get("group_ranks") or []:
            if r in where:
                ax.add_patch(Rectangle((where[r][1] - 0.5, where[r][0] - 0.5), 1, 1, fill=False, ec="#2a9d8f", lw=1))
        if straggler["rank"] in where:
            y, x = where[straggler["rank"]]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, ec="#00b4d8", lw=2.5, gid="straggler"))
    ax.set_xlabel("local rank" if rows == "host" else "rank within the row")
    ax.set_ylabel(rows)
    if len(grid) <= 40:
        ax.set_yticks(range(len(grid)), grid.index, fontsize=6)
    else:
        ax.set_yticks([])
    ax.set_title("\n".join(textwrap.wrap(title, 110)) + "\nthe straggler boxed, its group outlined; grey: no rank there "
                 "or no summary", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cells(table: pd.DataFrame, grid: pd.DataFrame) -> dict[int, tuple[int, int]]:
    """rank -> (row, column) in the heat map."""
    t = table.sort_values("rank")
    if t["host"].nunique() > 1:
        rows = {h: i for i, h in enumerate(grid.index)}
        cols = t.groupby(t["host"].astype(str)).cumcount()
        return {int(r): (rows[str(h)], int(c)) for r, h, c in zip(t["rank"], t["host"], cols)}
    return {int(r): (int(r) // 32, int(r) % 32) for r in t["rank"]}
