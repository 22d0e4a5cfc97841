"""What a failed delivery means: the server did not answer, it refused for good, or it may take
the same data later. Reads the error only; imports nothing heavy (requests, at most, on use).
"""

from __future__ import annotations

# Answers that sending the same data again can never change: the run or experiment is missing or
# deleted, access is denied, or a value is refused. Anything else (no answer, timeouts, 5xx,
# rate limits) may pass on a later try; so may a 401 (UNAUTHENTICATED): wrong or missing
# credentials belong to the sender's environment, not to the record, and the next sync may have
# the right ones.
PERMANENT_ERROR_CODES = frozenset({
    "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "INVALID_STATE", "BAD_REQUEST", "PERMISSION_DENIED",
})  # fmt: skip


def is_permanent(error: BaseException) -> bool:
    """True when the server answered with a refusal that a retry cannot change."""
    return getattr(error, "error_code", None) in PERMANENT_ERROR_CODES and not is_unreachable(error)


def reason(error: BaseException) -> str:
    """One line saying why a delivery failed, for warnings and the outbox's `reason` files."""
    code = getattr(error, "error_code", None)
    message = getattr(error, "message", None) or str(error)
    first = " ".join(str(message).split())[:300]
    if code and first.startswith(f"{code}:"):
        return first  # a REST error's message already starts with its code
    return f"{code}: {first}" if code else f"{type(error).__name__}: {first}"


def is_unreachable(error: BaseException) -> bool:
    """True when the server did not answer at all: refused, reset, DNS, or timed out.

    MLflow wraps these in an MlflowException whose context holds the requests/urllib3 error."""
    import requests

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (ConnectionError, TimeoutError, requests.exceptions.ConnectionError,
                              requests.exceptions.Timeout)):  # fmt: skip
            return True
        error = error.__cause__ or error.__context__
    return False
