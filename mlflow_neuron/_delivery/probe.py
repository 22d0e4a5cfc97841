"""Is the tracking server there at all? One short HTTP probe, with nothing heavier than urllib.

The CLI asks this before it imports torch or MLflow, so a dead server is reported in a second.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

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
