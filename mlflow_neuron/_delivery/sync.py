"""`mlflow-neuron sync`: the outbox's drain, run once from the command line, with a line per entry.

It runs the same code as the helper process (`drain`): queued cycles are prepared from their
saved traces, prepared ones are delivered, refused ones go to `rejected/`, unreadable ones to
`damaged/`, and a run's end entry ends the run once its cycles are in. It holds the outbox's
consumer lock (`entries`) for its pass: a lock the kernel releases, so a sync after a container or
a kill -9 takes the outbox at once, from any PID namespace, and a drain that holds it past
`BUSY_WAIT_S` (a training job's helper or close(), another sync) is named and left alone. Sending an entry twice leaves its data once, so a sync that is cut off can run again.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import entries, node_parts, outbox
from .drain import BUSY, CUT, DAMAGED, DELIVERED, ENDED, KEPT, REJECTED, Drain, Outcome
from .outbox import human_size
from .report import RedactingStream

BUSY_WAIT_S = 3.0  # a pass of a helper whose training process just ended stops within about a second


class OutboxBusy(RuntimeError):
    """Another process follows the outbox (a training job's helper, or another sync)."""

    def __init__(self, folder: Path, pid: int | None) -> None:
        who = f"another process (pid {pid})" if pid else "another process"
        super().__init__(f"{who} is delivering the outbox {folder} (a training job's helper or close(), or another "
                         "sync); "
                         "run sync again once it has ended")  # fmt: skip
        self.pid = pid


@dataclass
class SyncResult:
    """What one `sync` did. Unpacks as (delivered, kept) like earlier versions."""

    delivered: int = 0
    kept: int = 0  # deliverable entries still in the outbox (a transient failure, or another process had it)
    rejected: int = 0  # entries refused for good, now or earlier, left in <outbox>/rejected
    damaged: int = 0  # entries this sync set aside in <outbox>/damaged (with --retry-damaged: still damaged)
    cut: int = 0  # entries whose writer died before they were queued: removed, nothing to send (exit 0)
    unreachable: dict[str, str] = field(default_factory=dict)  # tracking URI -> why it did not answer
    refused: str | None = None  # why the outbox folder itself was not read (a link, another user's)
    busy: str | None = None  # another process follows the outbox: nothing was done
    changed: bool = False  # something was written to a server (a run created, data logged)

    def __iter__(self):
        return iter((self.delivered, self.kept))


def sync_outbox(folder: str, tracking_uri: str | None = None, out=None, *, retry_rejected: bool = False,
                retry_damaged: bool = False, run_id: str | None = None, err=None) -> SyncResult:  # fmt: skip
    """Delivers the outbox's entries into their runs, one line per entry, then a summary.

    A record the server refuses for good moves to `<outbox>/rejected/`, one that fails its seal to
    `<outbox>/damaged/`, each with a `reason` file; those are only tried again with
    `retry_rejected` (into `run_id` if given) or `retry_damaged`. Whatever it prints names no
    password.
    """
    out, err = RedactingStream(out or sys.stdout), RedactingStream(err or sys.stderr)
    result = SyncResult()
    try:
        if Path(folder).is_dir():
            outbox.check_private(Path(folder))  # a link or another user's folder: never read
            _sync_held(folder, tracking_uri, out, err, result, retry_rejected, retry_damaged, run_id)
        else:
            _summary(result, 0, folder, retry_rejected, out)
    except outbox.OutboxRefused as refused:
        result.refused = str(refused)
        print(f"mlflow-neuron sync: error: {refused}", file=err, flush=True)
    except OutboxBusy as busy:
        result.busy = str(busy)
        print(f"mlflow-neuron sync: {busy}", file=err, flush=True)
    return result


def _sync_held(folder: str, tracking_uri: str | None, out, err, result: SyncResult, retry_rejected: bool,
               retry_damaged: bool, run_id: str | None) -> None:  # fmt: skip
    drain = Drain(folder, _Notes(out), tracking_uri=tracking_uri, run_id=run_id, rejected=retry_rejected,
                  progress=lambda line: print(f"  {line}", file=out, flush=True))  # fmt: skip
    seen: list[Outcome] = []
    total = [0]  # cycles in the queue when the pass began

    def first() -> None:
        if retry_damaged:
            for record in outbox.damaged(folder):
                outbox.restore(record)
        total[0] = sum(entries.state(entry) != entries.ENDING and not node_parts.is_node_entry(entry)
                       for entry in entries.listed(drain.folder))  # fmt: skip

    def say(done: Outcome) -> None:
        counted = done.state != ENDED and not node_parts.is_node_entry(done.entry)  # a node's file: said, not counted
        if counted:
            seen.append(done)
        _say(done, f"[{len(seen)}/{total[0]}] {done.entry.name}" if counted else done.entry.name, folder, result, out,
             err)  # fmt: skip

    if drain.once(on_outcome=say, wait_s=BUSY_WAIT_S, before=first).other:
        lock = Path(folder) / entries.CONSUMER_LOCK
        raise OutboxBusy(Path(folder), entries.holder_pid(lock))
    result.changed = drain.courier.wrote
    _summary(result, total[0], folder, retry_rejected, out)


def _say(done: Outcome, prefix: str, folder: str, result: SyncResult, out, err) -> None:
    if done.state == DELIVERED and node_parts.is_node_entry(done.entry):
        print(f"{prefix}: the rank summaries of step {done.delivery.step}, in their node's file -> run "
              f"{done.run.run_id} at {done.run.tracking_uri}", file=out, flush=True)  # fmt: skip
    elif done.state == DELIVERED:
        result.delivered += 1
        note = f" ({len(done.vanished)} file(s) had disappeared)" if done.vanished else ""
        print(f"{prefix}: step {done.delivery.step} -> run {done.run.run_id} at {done.run.tracking_uri}: "
              f"{len(done.delivery.metrics) + len(done.delivery.summary)} metrics, {len(done.files)} file(s), "
              f"{human_size(sum(done.files.values()))}{note}", file=out, flush=True)  # fmt: skip
    elif done.state == ENDED:
        print(f"{prefix}: run {done.run.run_id} ended (FINISHED): all its cycles are in", file=out, flush=True)
    elif done.state == DAMAGED:
        result.damaged += 1
        where = f"; set aside in {done.moved.parent}" if done.moved else ""
        print(f"{prefix}: damaged, not sent: {done.why}{where}", file=out, flush=True)
    elif done.state == CUT:
        result.cut += 1
        print(f"{prefix}: {done.why}", file=out, flush=True)
    elif done.state == REJECTED:
        result.rejected += 1
        print(f"{prefix}: rejected, not retried ({done.why})", file=out, flush=True)
    elif done.state == BUSY:
        result.kept += 1
        print(f"{prefix}: kept, {done.why}", file=out, flush=True)
    elif done.state == KEPT:
        result.kept += 1
        uri = outbox.without_credentials(done.run.tracking_uri) if done.run else None
        if uri and done.unreachable:
            if uri not in result.unreachable:
                result.unreachable[uri] = done.why
                print(f"mlflow-neuron sync: error: {done.why}; its records stay in {folder}", file=err, flush=True)
        else:
            print(f"{prefix}: kept, {done.why}", file=out, flush=True)


class _Notes:
    """The drain's reporter in sync: what preparing a cycle found is printed; refusals, damage and
    a server that does not answer have their own lines."""

    strict = False

    def __init__(self, out) -> None:
        self.out = out

    def problem(self, kind: str, message: str, error: BaseException | None = None) -> None:
        if kind not in ("rejected", "damaged", "kept", "unreachable", "cut"):
            print(f"  {message}" + (f" ({error})" if error else ""), file=self.out, flush=True)


def _summary(result: SyncResult, total: int, folder: str, retry_rejected: bool, out) -> None:
    summary = f"synced {result.delivered} of {total} record(s) from {folder}; {result.kept} kept"
    if retry_rejected:
        print(f"{summary}; {result.rejected} still rejected", file=out, flush=True)
        result.kept += result.rejected  # asked for, and not delivered
        return
    summary += f"; {result.rejected} rejected" if result.rejected else ""
    summary += f"; {result.damaged} damaged" if result.damaged else ""
    print(summary + (f"; {result.cut} cut short by their process's end" if result.cut else ""), file=out, flush=True)
    refused = outbox.rejected(folder)
    if refused:
        result.rejected = len(refused)
        why = Counter(outbox.reason_of(r) for r in refused)
        print(f"{len(refused)} record(s) in {Path(folder) / outbox.REJECTED} were refused by the server and are "
              f"not retried: " + "; ".join(f"{n} x {text}" for text, n in why.most_common()), file=out)  # fmt: skip
        print(f"  fix the cause, then `mlflow-neuron sync --outbox {folder} --retry-rejected [--run-id ID]` "
              "sends them again (--run-id: into another run)", file=out, flush=True)  # fmt: skip
    broken = outbox.damaged(folder)
    if broken:
        print(f"{len(broken)} record(s) in {Path(folder) / outbox.DAMAGED} are damaged and not sent: "
              + "; ".join(f"{r.name}: {outbox.reason_of(r)}" for r in broken[:5])
              + (f"; and {len(broken) - 5} more" if len(broken) > 5 else ""), file=out)  # fmt: skip
        print(f"  restore their files, then `mlflow-neuron sync --outbox {folder} --retry-damaged` checks and "
              "sends them again", file=out, flush=True)  # fmt: skip
