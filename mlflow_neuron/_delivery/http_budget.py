"""MLflow's HTTP retries, bounded in the process that is ours, and a server's Retry-After kept for our retry loop.

Why: MLflow retries inside each call (MLFLOW_HTTP_REQUEST_MAX_RETRIES, default 7, with exponential
backoff, and a 429's or 503's Retry-After honoured for up to urllib3's 6 hours), so one call can
spend a whole exit budget: with 503s for the first 20 requests, a 60 s flush budget saw 6 requests
go out. In the helper process, which is ours, `bound_this_process()` makes each MLflow call one
HTTP request with a bounded timeout, and the sender's own loop does the retrying: it waits what the
server asked for (`Retry-After`, capped) or its own backoff, and stops waiting the moment the
callback closes, when the cycle is kept in the outbox.

The training process's environment and libraries are the user's and are left alone: nothing here
runs there. MLflow's own retries apply when it drains at a stop or at close, and the exit budget is
kept by `close` storing whatever was not sent in time. A Retry-After the helper was given is kept in
the outbox (`courier`), and the training process's drain heeds it.
"""

from __future__ import annotations

import os
import threading

MAX_RETRY_AFTER_S = 300.0  # a longer wait is capped: the cycle is safe on disk meanwhile
REQUEST_TIMEOUT_S = 30  # seconds without a byte from the server; a large upload may take longer in all

_seen = threading.local()


def bound_this_process() -> None:
    """One HTTP request per MLflow call, and a timeout of at most REQUEST_TIMEOUT_S; remembers
    each refusal's Retry-After for `retry_after_s`. Only for a process of this library's own."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "")
    if not timeout.isdigit() or int(timeout) > REQUEST_TIMEOUT_S:
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(REQUEST_TIMEOUT_S)
    remember_retry_after()


def retry_after_s() -> float | None:
    """The Retry-After of the last 429/503 this thread got since it last asked; None if there was none."""
    seconds, _seen.seconds = getattr(_seen, "seconds", None), None
    return seconds


def remember_retry_after() -> None:
    """Lets `retry_after_s` see what a refusal asked for. Only for a process of this library's own
    (the helper, `sync`): it patches urllib3."""
    # urllib3 drops the response once its retries are spent (0 here): its Retry.increment is the
    # one place that sees the answer's headers before the error is raised.
    from urllib3.util.retry import Retry

    if getattr(Retry.increment, "_remembers_retry_after", False):
        return
    increment = Retry.increment

    def remembering(self, method=None, url=None, response=None, *args, **kwargs):
        header = response.headers.get("Retry-After") if response is not None else None
        if header is not None and response.status in Retry.RETRY_AFTER_STATUS_CODES:
            try:
                _seen.seconds = min(self.parse_retry_after(header), MAX_RETRY_AFTER_S)
            except Exception:  # noqa: BLE001 - a malformed header is the server's; our backoff applies
                _seen.seconds = None
        return increment(self, method, url, response, *args, **kwargs)

    remembering._remembers_retry_after = True
    Retry.increment = remembering
