"""A cycle's op table as text, in the layout of torch's `key_averages().table()`. Pure.

torch's own table needs `prof.events()`, the full Python parse of the cycle (seconds on the
training thread for 100k events); this one is rendered from the cycle's `CycleProfile` instead.
"""

from __future__ import annotations

from .profile import NOT_PROFILED, PRESENT, CycleProfile

NAME_WIDTH = 120  # as `max_name_column_width` in the fallback's own key_averages() table


def cycle_table(profile: CycleProfile) -> str:
    """The cycle's ops, costliest first (device time when there is some), with torch's columns."""
    device = profile.device.upper()
    with_device = profile.device_time != NOT_PROFILED
    by_device = profile.device_time == PRESENT
    columns = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if with_device:
        columns += [f"Self {device}", f"Self {device} %", f"{device} total", f"{device} time avg"]
    columns.append("# of Calls")
    cpu_total, device_total = profile.total_self_cpu_time_us, profile.total_self_device_time_us
    rows = []
    for op in sorted(profile.ops, key=lambda o: -(o.self_device_time_us if by_device else o.self_cpu_time_us)):
        row = [op.name, _percent(op.self_cpu_time_us, cpu_total), _time(op.self_cpu_time_us),
               _percent(op.cpu_time_us, cpu_total), _time(op.cpu_time_us), _time(op.cpu_time_us / op.calls)]
        if with_device:
            row += [_time(op.self_device_time_us), _percent(op.self_device_time_us, device_total),
                    _time(op.device_time_us), _time(op.device_time_us / op.calls)]
        rows.append([*row, str(op.calls)])
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    widths[0] = min(widths[0], NAME_WIDTH)
    line = "-" * (sum(widths) + 2 * (len(widths) - 1))

    def render(cells):
        name = str(cells[0])[: widths[0]]
        return "  ".join([name.ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:])])

    text = [line, render(columns), line, *map(render, rows), line, f"Self CPU time total: {_time(cpu_total)}"]
    if with_device:
        text.append(f"Self {device} time total: {_time(device_total)}")
    return "\n".join(text) + "\n"


def _time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _percent(part: float, whole: float) -> str:
    return f"{part / whole * 100:.2f}%" if whole else "0.00%"
