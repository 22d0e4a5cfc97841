"""Preparing an outbox entry (queued -> prepared), the drain's first step for each entry: the
cycle read from its saved trace, its files written, its rank summary handed to its node's parts
(`node_parts`), its record sealed. Runs under the outbox's consumer lock, in whichever process
drains (`drain.Drain`, which this is part of), or on the training thread for a job that holds
that process's own objects (`producer`)."""

from __future__ import annotations

import contextlib
import os
from functools import partial
from pathlib import Path

from . import entries, node_parts
from . import outbox as _outbox
from .entries import END, FILES, JOB, TRIED
from .outbox import nothing_to_send
from .._record.job import CycleJob
from .._record.model import RunRef


class Preparing:
    """The preparing half of `drain.Drain` (its `reporter`, `outbox`, `memory`, `_preparers`,
    `_state`, `_parts`, `copy_max_bytes` and `last_profile`)."""

    def _prepare_entry(self, entry: Path, done, on_outcome) -> bool:
        try:
            data = entries.read_json(entry / JOB)
            job = CycleJob.from_entry(data["job"], entry)
            job.source = self.memory.pop(entry, None) or job.source
            run, settings = RunRef(**data["run"]), dict(data["preparer"])
            problems = [tuple(p) for p in data.get("problems", ())]
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._damaged(entry, f"its {JOB} cannot be read ({type(error).__name__}: {error})", done, on_outcome)
            return False
        self.prepare(entry, job, run, settings, problems, parts=data.get("parts"))
        return True

    def prepare(self, entry: Path, job: CycleJob, run: RunRef, settings: dict, problems=(), parts=None) -> None:
        """Turns a held entry's job into its record (queued -> prepared): the cycle read, its files
        written into `files/`, its rank summary into its node's parts (`parts`: their area's name,
        `node_parts`), record.json sealed, job.json removed. The op keys of a run are shared by
        every process that prepares its cycles (`.keys-<run>.json` in the outbox)."""
        from .._record.prepare import Preparer

        key = (batch_key(run), tuple(sorted(settings.items())))
        preparer = self._preparers.get(key)
        if preparer is None:
            preparer = self._preparers[key] = Preparer(self.reporter, **settings, node_parts=True)
        keys_file = self.outbox / f".keys-{run.run_key or run.run_id or 'none'}.json"
        with entries.store_lock(self.outbox), contextlib.suppress(OSError, ValueError):
            self._state.take(keys_file, preparer.absorb)
        job.tried = (entry / TRIED).exists()
        node_parts.unrecorded(entry / FILES)
        delivery = preparer.prepare(job)
        with entries.store_lock(self.outbox):  # the run's summary: after what others wrote, before they write again
            delivery = self._state.put(keys_file, preparer.absorb, preparer.export,
                                       partial(preparer.with_run_summary, delivery))  # fmt: skip
        self.last_profile = preparer.last_profile or self.last_profile
        carried = []
        if delivery.rank_part is not None:  # into its node's parts, before the record: see `node_parts`
            folder = node_parts.run_folder(entry.parent, parts or node_parts.area_name(run))
            delivery = node_parts.take(entry, delivery, run, folder)
            if nothing_to_send(delivery):  # its node's file, when it can be made, is an entry of its own
                self._parts.append((folder, delivery.step))
            else:  # sent anyway: where its part completes the cycle, the cycle's file goes with it
                delivery, carried = node_parts.ride_along(delivery, folder)
        _outbox.write_record(entry, delivery, run, copy_max_bytes=self.copy_max_bytes, files_dir=FILES, skip=(JOB, END))
        node_parts.carried(carried)  # its record sends them now
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry / JOB)
        for kind, message in [*problems, *job.problems]:
            self.reporter.problem(kind, message)


def batch_key(run: RunRef) -> str:
    """Runs are told apart (for batching, for a run's preparer) by server and run; a URI's
    credentials do not count."""
    return f"{_outbox.without_credentials(run.tracking_uri)}|{run.run_id}|{run.run_key}"
