"""An HTTP proxy in front of a real `mlflow server` that answers chosen requests itself: a 503 or
429 with a Retry-After header, or a connection reset part way through a request's body; or holds
a request a while before forwarding it.

Each connection carries one request (the proxy asks the server to close after its answer), so
requests are told apart without parsing the server's answers. `seen` lists every request as
(monotonic time, method, path, what the proxy did), for tests to read the client's pacing."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from servers import HOST


@dataclass(frozen=True)
class Refuse:
    status: int  # 429 or 503
    retry_after_s: int | None = None


@dataclass(frozen=True)
class Reset:
    after_body_bytes: int  # forwarded to the server before the client's connection is reset


@dataclass(frozen=True)
class Delay:
    seconds: float  # the request is held this long, then forwarded


@dataclass(frozen=True)
class Hold:
    release: threading.Event  # the request is held until this is set (at most limit_s), then forwarded
    limit_s: float = 120.0


Plan = Callable[[int, str, str], "Refuse | Reset | Delay | Hold | None"]  # (request index, method, path) -> fault


class FaultProxy:
    def __init__(self, target_port: int, plan: Plan) -> None:
        self.target_port = target_port
        self.plan = plan
        self.seen: list[tuple[float, str, str, str]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.2)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="FaultProxy")

    @property
    def uri(self) -> str:
        return f"http://{HOST}:{self._listener.getsockname()[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()

    def refused(self) -> list[tuple[float, str, str, str]]:
        with self._lock:
            return [entry for entry in self.seen if entry[3].startswith("refused")]

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                head, body = _read_head(client)
            except OSError:
                return
            if not head:
                return
            method, path = head.split(b" ", 2)[:2]
            method, path = method.decode(), path.decode()
            with self._lock:
                index = len(self.seen)
                fault = self.plan(index, method, path)
                done = ("forwarded" if fault is None else f"refused {fault.status}" if isinstance(fault, Refuse)
                        else "delayed" if isinstance(fault, (Delay, Hold)) else "reset")  # fmt: skip
                self.seen.append((time.monotonic(), method, path, done))
            try:
                if isinstance(fault, Refuse):
                    _drain_body(client, head, body)
                    retry = f"Retry-After: {fault.retry_after_s}\r\n" if fault.retry_after_s is not None else ""
                    client.sendall(f"HTTP/1.1 {fault.status} Busy\r\n{retry}Content-Length: 0\r\n"
                                   "Connection: close\r\n\r\n".encode())  # fmt: skip
                    return
                if isinstance(fault, Delay):
                    time.sleep(fault.seconds)
                if isinstance(fault, Hold):  # outside the lock: other requests go on meanwhile
                    fault.release.wait(fault.limit_s)
                with socket.create_connection((HOST, self.target_port), timeout=30) as upstream:
                    if isinstance(fault, Reset):  # part of the body, never all of it
                        cut = min(fault.after_body_bytes, int(_headers(head).get("content-length", "1")) // 2)
                        while len(body) < cut and (chunk := client.recv(65536)):
                            body += chunk
                        upstream.sendall(_closing(head) + body[:cut])
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return  # closing with linger 0 sends the client a reset
                    upstream.sendall(_closing(head) + body)
                    threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
                    _pump(upstream, client)
            except OSError:
                pass


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", body


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}


def _drain_body(sock: socket.socket, head: bytes, body: bytes) -> None:
    headers = _headers(head)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while not body.endswith(b"0\r\n\r\n") and (chunk := sock.recv(65536)):
            body += chunk
        return
    left = int(headers.get("content-length", "0")) - len(body)
    while left > 0 and (chunk := sock.recv(min(left, 65536))):
        left -= len(chunk)


def _closing(head: bytes) -> bytes:
    """The request head, asking the server to close the connection after its answer."""
    lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
