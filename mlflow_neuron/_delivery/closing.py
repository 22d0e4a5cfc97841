"""What the end of a profile says: a progress line while it waits, each refusal once, and one
warning for what is left, where it is, and the `sync` command that sends it; a server found dead
is held for that warning (`HeldUnreachable`).

The functions read a `Producer` (its entries, their states on disk, its run and reporter); they
are apart from it because they are wording, not delivery.
"""

from __future__ import annotations

import sys
import time

from . import entries, node_parts
from . import outbox as _outbox
from .drain import KEPT
from .outbox import human_size
from .report import WAIT_IN_OUTBOX, one_line, redact, rejected_message
from .report import logger as _log

# A server found dead is said at the end, in the one warning that names what is kept and the
# `sync` command; a job that goes on profiling this long after is told at its next cycle.
UNREACHABLE_HOLD_S = 10.0


class HeldUnreachable:
    """The reporter the drains and the helper report through: everything passes, except the first
    "not reachable", which waits (`release`) so that a script that ends soon after says one warning."""

    KIND = "unreachable"

    def __init__(self, reporter) -> None:
        self.reporter = reporter
        self.held: tuple[float, str, BaseException | None] | None = None
        self._done = False

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        if kind == self.KIND and not self._done:
            if self.held is None:
                self.held = (time.monotonic(), message, error)
            return
        self.reporter.problem(kind, message, error)

    def release(self, *, say: bool) -> None:
        """Says the held warning (`say`), or drops it (at the end: the closing warning says why, or
        everything arrived after all); from then on every "not reachable" passes."""
        held, self.held, self._done = self.held, None, True
        if say and held is not None:
            self.reporter.problem(self.KIND, held[1], held[2])

    def due(self) -> bool:
        return self.held is not None and time.monotonic() - self.held[0] >= UNREACHABLE_HOLD_S

    def __getattr__(self, name: str):  # strict, counts: the reporter's own
        return getattr(self.reporter, name)


def progress(producer, left: float | None) -> bool:
    """One line on stderr while close() waits: the cycles and bytes left, and for how long more."""
    unsettled = [entry for entry, step in producer._unsettled() if step is not None]
    size = sum(f.stat().st_size for entry in unsettled for f in entry.rglob("*") if f.is_file())
    more = f"; waiting up to {left:.0f} s more" if left is not None else ""
    print(redact(f"mlflow-neuron: delivering {len(unsettled)} profiler cycle(s), {human_size(size)}, to "
                 f"{producer.run.tracking_uri}{more}"), file=sys.stderr, flush=True)  # fmt: skip
    return True


def refusals(producer) -> None:
    """Each of this process's cycles the server refused for good, said once, on this thread (the
    drain that refused it may be the helper's), from its reason file; strict mode raises it."""
    from mlflow.exceptions import MlflowException

    for path in producer.rejected:
        if path not in producer._refusals_said:
            producer._refusals_said.add(path)
            step = next((s for e, s in producer.mine if e.name == path.name), "?")
            why = _outbox.reason_of(path)
            what = f"profiler step {step}" if step is not None else "a record of step times"
            producer.reporter.problem("rejected", rejected_message(what, producer.run, why, path), MlflowException(why))


def summaries(producer) -> None:
    """One line for every cycle of this process refused for good or lost, where the first
    warning named only one (said once)."""
    refused = producer.rejected
    if len(refused) > 1:
        producer.reporter.problem(
            "rejected_summary",
            f"{len(refused)} profiler cycle(s) were refused by the server and are kept in {refused[0].parent} (see "
            f"the reason file in each); once the cause is fixed, `mlflow-neuron sync --outbox {producer.outbox} "
            "--retry-rejected [--run-id ID]` sends them",
        )  # fmt: skip
    if len(producer.lost) > 1:
        producer.reporter.problem("lost_summary", f"{len(producer.lost)} profiler cycle(s) lost (steps "
                                  f"{', '.join(str(step) for step, _ in producer.lost)}): neither queued nor "
                                  "delivered")  # fmt: skip


def left(producer) -> None:
    """One warning for what close() leaves in the outbox: how many cycles, their steps, why, where,
    and the command that sends them; and the node files of the run's rank summaries that the last
    local rank to leave could not send (`node_parts`; while another local rank lives, that one does)."""
    unsettled = producer.waited_for()  # the run's end, where a local rank that lives on ends it, is not named
    cycles = [step for _, step in unsettled if step is not None]
    ends = any(step is None and entries.state(entry) == entries.ENDING for entry, step in unsettled)
    nodes = producer.node_files_left() if node_parts.alone(producer.outbox, producer.parts_area) else []
    if not unsettled and not nodes:
        return
    if not cycles and not nodes and ends:  # the run's end (metrics alone may wait before it: sync sends them too)
        producer.reporter.problem("end_run", f"run {producer.run_id} was left RUNNING: it could not be ended in "
                                  f"time; `mlflow-neuron sync --outbox {producer.outbox}` ends it")  # fmt: skip
        return
    if not cycles and not nodes:  # metrics alone (the schedule's step times)
        producer.reporter.problem("kept", f"{len(unsettled)} record(s) of step times were not sent to "
                                  f"{producer.run.tracking_uri}; `mlflow-neuron sync --outbox {producer.outbox}` "
                                  "sends them")  # fmt: skip
        return
    done = producer._last
    why = next(iter(done.unreachable.values()), None) if done is not None else None
    why = why or next((o.why for o in (done.outcomes if done else []) if o.state == KEPT and o.why), None)
    held = producer.unreachable.held  # the server found dead by the helper, or by an earlier pass
    why = why or (held[1].split(WAIT_IN_OUTBOX, 1)[0] if held is not None else None)
    why = why or "not delivered before the callback closed"
    ending = ""
    if ends:  # the run's end waits behind them
        ending = (" The run stays RUNNING until then; sync ends it." if producer.run_id else
                  " That sync creates the run and ends it.")  # fmt: skip
    folders = sorted({str(entry.parent) for entry, _ in unsettled} | ({str(producer.outbox)} if nodes else set()))
    commands = " and ".join(f"`mlflow-neuron sync --outbox {folder}`" for folder in folders)
    what = [f"{len(cycles)} profiler cycle(s) (steps {', '.join(map(str, cycles))})"] if cycles else []
    what += [f"the rank summaries of {len(nodes)} cycle(s) (steps {', '.join(map(str, nodes))})"] if nodes else []
    producer.reporter.problem(
        "kept",
        f"{' and '.join(what)} were not sent to {producer.run.tracking_uri} ({one_line(RuntimeError(why))}); "
        f"they are kept in {' and '.join(folders)}: run {commands} to send them.{ending}",
    )  # fmt: skip
    _log.debug("kept entries: %s", [str(entry) for entry, _ in unsettled])
