"""What a failed delivery means: the server did not answer, it refused for good, or it may take
the same data later. Reads the error only; imports nothing heavy (requests, at most, on use).
"""

from __future__ import annotations

import re

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
