"""Records without a cycle: the step times of the callback's own schedule between captures, and
its plans (`_record.capture_request.PLAN_TAG`). Each is a prepared entry of the outbox, sent by
the drain as a cycle's metrics and tags are, and kept through a dead server like one."""

from __future__ import annotations

from . import entries
from . import outbox as _outbox
from .._record.model import Delivery


def queue_record(producer, delivery: Delivery, what: str) -> bool:
    """Queues `delivery` (metrics and tags alone: no files) as a prepared entry of `producer`'s
    outbox; in its `mine` with step None, as the run's end is: not a cycle. A failure is said once
    (`what` names the record) and never raised: training goes on."""
    try:
        held = entries.create(producer.outbox)  # its rename into the outbox is what a consumer sees
        try:
            # write_record writes the run without its credentials
            _outbox.write_record(held.path, delivery, producer.run, copy_max_bytes=0, files_dir=None)
        except BaseException:
            entries.remove(held.path)
            raise
        finally:
            held.release()
    except Exception as error:  # noqa: BLE001 - said once; training goes on
        producer.reporter.problem("record", f"{what} could not be queued", error)
        return False
    producer.mine.append((held.path, None))
    producer._after_submit()
    return True
