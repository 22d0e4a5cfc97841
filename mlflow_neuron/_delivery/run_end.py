"""A run's end in the queue (`end.json`, queued by the `close()` of the callback that created
the run): the run is ended (FINISHED) here, once no earlier entry of it is left and its node's
files of the rank summaries went (`node_parts`: other local ranks may close after it), by whichever
drain meets it; the only place that ends a run."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from . import entries, node_parts
from . import outbox as _outbox
from .entries import END
from .failures import is_permanent
from .._record.model import RunRef


def end_when_due(drain, entry: Path, done, on_outcome) -> RunRef | None:
    """Ends the run an end entry names once no earlier entry of it is left in the queue (its
    cycles, and the node files of its cycles: `node_parts`); returns the run once ended (the
    entry gone), None while it waits or where it was set aside."""
    try:
        data = entries.read_json(entry / END)
        run, parts = RunRef(**data["run"]), data.get("parts")  # its node's parts area (an end queued before: none)
    except (OSError, ValueError, KeyError, TypeError) as error:
        drain._damaged(entry, f"its {END} cannot be read ({error})", done, on_outcome)
        return None
    earlier = [e for e in entries.listed(drain.folder) if e.name < entry.name and _outbox.run_key_of(e) == run.run_key]
    if earlier:  # delivered, or kept, by this drain or another: ended on a later pass
        done.busy += 1
        return None
    if isinstance(parts, str) and node_parts.pending(drain.outbox, parts):  # counted in `Pass.waiting`
        return None  # its node's files wait for a local rank's part, or are queued: ended once they went
    logger = None
    try:
        logger = drain.courier.logger(run, create=False)
        if logger.run.run_id is not None:
            from mlflow.entities import RunStatus

            if logger.client.get_run(logger.run.run_id).info.status == RunStatus.to_string(RunStatus.RUNNING):
                logger.end_run()
                drain.courier.wrote = True
    except Exception as error:  # noqa: BLE001 - classified: kept unless the run is gone for good
        if not is_permanent(error):
            drain._kept(entry, error, done, on_outcome, run=run)
            return None
    with contextlib.suppress(OSError):  # the run's id stays for its callback to read (`Producer.run_id`)
        os.unlink(drain.outbox / f".keys-{run.run_key}.json")
    entries.remove(entry)
    return logger.run if logger is not None else run
