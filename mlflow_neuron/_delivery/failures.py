"""What a failed delivery means: the server did not answer, it refused for good, or it may take
the same data later; and whether an HTTP tracking server is there at all (`check_reachable`, one
short probe, which the CLI asks before it imports torch or MLflow: a dead server is reported in a
second). Imports nothing heavy (requests, at most, on use).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request

# Answers that sending the same data again can never change: the run or experiment is missing or
# deleted, access is denied, or a value is refused. Anything else (no answer, timeouts, 5xx,
# rate limits) may pass on a later try; so may a 401 (UNAUTHENTICATED): wrong or missing
# credentials belong to the sender's environment, not to the record, and the next sync may have
# the right ones.
PERMANENT_ERROR_CODES = frozenset({
    "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "INVALID_STATE", "BAD_REQUEST", "PERMISSION_DENIED",
})  # fmt: skip


# A refusal whose text says the server's database tripped over concurrent writers (two syncs, a
# sync beside the training process): MLflow reports some of these as INVALID_PARAMETER_VALUE, yet
# the same request goes through once the other writer is done.
_TRANSIENT_DATABASE = re.compile(
    r"IntegrityError|constraint failed|UNIQUE constraint|FOREIGN KEY|duplicate key|deadlock|database is locked"
    r"|could not serialize|OperationalError|TEMPORARILY_UNAVAILABLE|RESOURCE_EXHAUSTED", re.IGNORECASE
)


def is_permanent(error: BaseException) -> bool:
    """True when the server answered with a refusal that a retry cannot change."""
    if getattr(error, "error_code", None) not in PERMANENT_ERROR_CODES or is_unreachable(error):
        return False
    return not _TRANSIENT_DATABASE.search(str(getattr(error, "message", None) or error))


def reason(error: BaseException) -> str:
    """One line saying why a delivery failed, for warnings and the outbox's `reason` files."""
    code = getattr(error, "error_code", None)
    message = getattr(error, "message", None) or str(error)
    first = " ".join(str(message).split())[:300]
    if code and first.startswith(f"{code}:"):
        return first  # a REST error's message already starts with its code
    return f"{code}: {first}" if code else f"{type(error).__name__}: {first}"


def is_unreachable(error: BaseException) -> bool:
    """True when the server did not answer at all, or stopped halfway: refused, reset, DNS, timed
    out, or an answer cut off mid-body (a server that died while it answered).

    MLflow wraps these in an MlflowException whose context holds the requests/urllib3 error."""
    from http.client import IncompleteRead

    import requests
    from urllib3.exceptions import ProtocolError

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (ConnectionError, TimeoutError, IncompleteRead, ProtocolError,
                              requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                              requests.exceptions.ChunkedEncodingError)):  # fmt: skip
            return True
        error = error.__cause__ or error.__context__
    return False


PROBE_TIMEOUT_S = 3.0


def check_reachable(tracking_uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raises ConnectionError fast when an HTTP tracking server does not answer at all.

    MLflow's client retries a dead server for minutes (MLFLOW_HTTP_REQUEST_MAX_RETRIES and
    backoff, process-wide settings this library leaves alone); one short probe first lets the
    sender go on to retry or the outbox instead. Any HTTP answer, even an error, counts as alive.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return
    # /health needs no login; urllib would take a URI's user:password@ for part of the host name.
    parts = urllib.parse.urlsplit(tracking_uri)
    probe = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
    try:
        urllib.request.urlopen(f"{probe.rstrip('/')}/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as error:
        cause = getattr(error, "reason", error)  # URLError wraps the socket error
        why = f"no answer within {timeout:g} s" if isinstance(cause, TimeoutError) else str(cause)
        raise ConnectionError(f"tracking server {probe} is not reachable ({why})") from error
