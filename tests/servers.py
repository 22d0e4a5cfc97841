"""Real servers for tests: an `mlflow server` process, a latency-adding TCP proxy, a hung socket,
Postgres.

    with MlflowServer(tmp_path / "srv") as server:          # sqlite backend, served artifacts
        client = MlflowClient(server.uri)                   # http://127.0.0.1:PORT
        ...
        server.kill()                                       # crash (SIGKILL to the whole group)
        server.restart()                                    # same port, same stores

    with DelayProxy(server.port, delay_s=0.05) as proxy:    # +50 ms on every REST request
        client = MlflowClient(proxy.uri)

    with HungServer() as hung:                              # accepts connections, never answers
        client = MlflowClient(hung.uri)                     # every call waits for its timeout

Everything binds 127.0.0.1 only, every wait is bounded, and every process or thread started
here ends by itself: servers are stopped at interpreter exit and, should the test process be
killed outright, by a small watchdog that kills the server's process group.

A client call to a dead server retries for minutes with MLflow's defaults (7 retries with
exponential backoff); set MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 (and MLFLOW_HTTP_REQUEST_TIMEOUT)
in tests that expect failures. MLflow reads them at each call, so monkeypatch.setenv works.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from pathlib import Path

HOST = "127.0.0.1"
POSTGRES_URI_ENV = "MLFLOW_NEURON_TEST_POSTGRES_URI"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_is_open(port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def postgres_uri() -> str | None:
    """The Postgres database for tests (set by `eval "$(bash .ci/postgres.sh)"`), or None."""
    return os.environ.get(POSTGRES_URI_ENV) or None


# --------------------------------------------------------------------------------------------
# mlflow server


@functools.lru_cache(maxsize=None)
def _server_options() -> frozenset[str]:
    """The option names `mlflow server` accepts (empty if they cannot be read)."""
    try:
        from mlflow.cli import server

        return frozenset(opt for p in server.params for opt in p.opts)
    except Exception:
        return frozenset()


# Our own HTTP opener: no proxies from the environment for 127.0.0.1 health checks.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# The server is started through this `sh`, which execs `mlflow server` (so the server's pid is
# the shell's pid and its process group id) after forking a watchdog into the same group: should
# the test process disappear without stopping the server (SIGKILL, crash), the watchdog SIGKILLs
# the group. A normal stop() or kill() signals the group, watchdog included.
# (`kill -KILL "-$$"`, not `kill -KILL -- ...`: dash's kill does not take "--".)
_LAUNCHER = r"""
parent=$1; shift
( while kill -0 "$parent" 2>/dev/null; do sleep 1; done; kill -KILL "-$$" ) </dev/null >/dev/null 2>&1 &
exec "$@"
"""

_live_servers: weakref.WeakSet[MlflowServer] = weakref.WeakSet()


@atexit.register
def _stop_live_servers() -> None:
    for server in list(_live_servers):
        try:
            server.stop(timeout=5)
        except Exception:
            pass


class ServerError(RuntimeError):
    """The server did not come up; the message ends with the tail of its log."""


class MlflowServer:
    """A real `mlflow server` (uvicorn, 1 worker) on 127.0.0.1, run from this Python's venv.

    Backend: `backend_store_uri`, default `sqlite:///<workdir>/mlflow.db`. Artifacts are served
    (`--serve-artifacts`, `mlflow-artifacts:/` URIs), stored in `<workdir>/artifacts`, so clients
    upload and download through the server. Output goes to `<workdir>/server.log` (appended over
    restarts). The server is started in its own session; stop() and kill() signal the whole group
    (the `mlflow server` CLI process and its uvicorn child).

    MLflow's job runner (a pool of huey consumer processes, for LLM-judge jobs) is turned off via
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false: tests do not need it and it costs 7 processes.
    """

    def __init__(
        self,
        workdir: Path,
        backend_store_uri: str | None = None,
        port: int | None = None,
        *,
        extra_args: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.backend_store_uri = backend_store_uri or f"sqlite:///{self.workdir / 'mlflow.db'}"
        self.artifacts_dir = self.workdir / "artifacts"
        self.log_path = self.workdir / "server.log"
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.last_start_s: float | None = None  # seconds the latest start() took
        self._proc: subprocess.Popen | None = None
        self._group_gone = True  # no process of the latest group is left: never signal it again

    # -- properties

    @property
    def uri(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        """Whether the server process is running (it may still be starting)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", self.backend_store_uri,
            "--serve-artifacts",
            "--artifacts-destination", str(self.artifacts_dir),
            "--host", HOST,
            "--port", str(self.port),
        ]  # fmt: skip
        options = _server_options()
        if not options or "--workers" in options:
            cmd += ["--workers", "1"]
        return cmd + self.extra_args

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The client-side settings of the test process are not the server's business.
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID",
                     "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):  # fmt: skip
            env.pop(name, None)
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

    def health(self, timeout: float = 2.0) -> bool:
        """Whether GET /health answers 200 now."""
        try:
            with _opener.open(f"{self.uri}/health", timeout=timeout) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    # -- lifecycle

    def start(self, timeout: float = 60) -> MlflowServer:
        """Start the server and wait until GET /health answers 200 (at most `timeout` s)."""
        if self.alive:
            return self
        if port_is_open(self.port):
            raise ServerError(f"port {self.port} is already in use; not starting a server there")
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} starting: {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                ["sh", "-c", _LAUNCHER, "mlflow-server-launcher", str(os.getpid()), *self.command()],
                cwd=self.workdir,  # anything the server writes to its cwd stays in workdir
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: pgid == pid
                close_fds=True,
            )
        self._group_gone = False
        _live_servers.add(self)
        deadline = t0 + timeout
        while True:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                self._cleanup_group(grace=2)
                raise ServerError(
                    f"mlflow server exited with code {rc} while starting\n"
                    f"--- {self.log_path} (tail) ---\n{self.log_tail()}"
                )
            if self.health(timeout=1.0):
                self.last_start_s = time.monotonic() - t0
                return self
            if time.monotonic() >= deadline:
                self.stop()
                raise ServerError(
                    f"mlflow server did not answer {self.uri}/health within {timeout:.0f} s\n"
                    f"--- {self.log_path} (tail) ---\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _signal_group(self, sig: int) -> bool:
        """Send `sig` to the server's process group; False if the group no longer exists."""
        if self._proc is None or self._group_gone:
            return False  # once the group is gone its id may be reused: never signal it again
        try:
            os.killpg(self._proc.pid, sig)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:  # pgid reused by someone else's process: not ours any more
            return False

    def _group_exists(self) -> bool:
        """Whether a process of the server's group is still running (zombies do not count)."""
        if self._proc is None or self._group_gone:
            return False
        pgid = self._proc.pid
        try:
            entries = os.listdir("/proc")
        except OSError:  # no procfs: ask the kernel (zombies count there)
            return self._signal_group(0)
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 2 and int(fields[2]) == pgid:
                if fields[0] not in (b"Z", b"X"):
                    return True
                # A multithreaded process whose main thread has exited shows "Z" while its other
                # threads still run (and still hold its sockets).
                try:
                    if len(os.listdir(f"/proc/{entry}/task")) > 1:
                        return True
                except OSError:
                    pass
        return False

    def _cleanup_group(self, grace: float) -> None:
        """Make sure no process of the group is left (the main one is reaped already)."""
        deadline = time.monotonic() + grace
        while self._group_exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._group_exists():
            self._signal_group(signal.SIGKILL)
            deadline = time.monotonic() + 5
            while self._group_exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # members killed but not yet reaped by their parent/init
        self._group_gone = not self._group_exists()
        _live_servers.discard(self)
        deadline = time.monotonic() + 5
        while port_is_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)  # the listening socket closes with the last thread holding it

    def stop(self, timeout: float = 15) -> None:
        """Graceful stop: SIGTERM to the group, wait up to `timeout` s, then SIGKILL. Idempotent."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._proc.wait(timeout=10)
        self._cleanup_group(grace=min(timeout, 5))

    def kill(self) -> None:
        """Crash: SIGKILL to the whole group at once, no shutdown of any kind."""
        if self._proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._cleanup_group(grace=2)

    def restart(self, timeout: float = 60) -> MlflowServer:
        """stop() (a no-op after kill()), then start() on the same port with the same stores."""
        self.stop()  # returns once the port is closed (bounded)
        return self.start(timeout=timeout)

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "stopped"
        return f"MlflowServer({self.uri}, {self.backend_store_uri!r}, {state})"


# --------------------------------------------------------------------------------------------
# a server that hangs


class HungServer:
    """A socket on 127.0.0.1 that accepts connections and never answers; it closes by itself."""

    def __init__(self, lifetime_s: float = 180.0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((HOST, 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.uri = f"http://{HOST}:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + lifetime_s
        self._thread = threading.Thread(target=self._accept, name="hung-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._held.append(conn)  # held open, never read from or answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self._held:
            conn.close()
        self._sock.close()

    def __enter__(self) -> HungServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# latency


class DelayProxy:
    """TCP proxy 127.0.0.1:port -> 127.0.0.1:target_port that adds `delay_s` to each request.

    The delay is applied on the client->server direction, once per HTTP request: before the first
    chunk a client sends on a connection, and before the first chunk it sends after the server
    has answered something (the next request on a keep-alive connection). A request whose body
    arrives in many chunks is delayed once, not per chunk. `delay_s` may be changed at any time;
    `target_port` too (new connections use it). If the target refuses the connection, the client
    connection is closed. `requests` counts the delayed chunks, i.e. the requests seen.
    """

    BUFSIZE = 64 * 1024

    def __init__(self, target_port: int, delay_s: float = 0.05, port: int | None = None,
                 connect_timeout: float = 5.0):  # fmt: skip
        self.target_port = target_port
        self.delay_s = delay_s
        self.connect_timeout = connect_timeout
        self._port = port
        self.requests = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._threads: set[threading.Thread] = set()
        self._sockets: set[socket.socket] = set()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("DelayProxy not started")
        return self._port

    @property
    def uri(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> DelayProxy:
        if self._accept_thread is not None:
            return self
        self._stopping.clear()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self._port or 0))
        listener.listen(64)
        listener.settimeout(0.2)  # accept() wakes up to notice stop()
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"DelayProxy:{self._port}",
                                               daemon=True)  # fmt: skip
        self._accept_thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every open connection; join the threads (bounded)."""
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            self._close(s)
        deadline = time.monotonic() + timeout
        threads = [self._accept_thread] if self._accept_thread else []
        with self._lock:
            threads += list(self._threads)
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._accept_thread = None
        self._listener = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._sockets) // 2

    # -- internals

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=self._run_tracked, args=(target, *args), daemon=True,
                             name=f"DelayProxy:{self._port}:{target.__name__}")  # fmt: skip
        with self._lock:
            self._threads.add(t)
        t.start()

    def _run_tracked(self, target, *args) -> None:
        try:
            target(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept_loop(self) -> None:
        listener = self._listener
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break  # listener closed
            client.settimeout(None)
            self._spawn(self._handle, client)

    def _handle(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((HOST, self.target_port), timeout=self.connect_timeout)
        except OSError:
            self._close(client)  # target dead: the client sees the connection closed
            return
        upstream.settimeout(None)
        for s in (client, upstream):  # forward small writes at once (no Nagle/delayed-ACK stalls)
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        with self._lock:
            if self._stopping.is_set():
                for s in (client, upstream):
                    s.close()
                return
            self._sockets.update((client, upstream))
        state = {"server_spoke": True}  # True: the next client chunk starts a new request
        self._spawn(self._pump, upstream, client, state, False)
        self._pump(client, upstream, state, True)

    def _pump(self, src: socket.socket, dst: socket.socket, state: dict, from_client: bool) -> None:
        try:
            while not self._stopping.is_set():
                data = src.recv(self.BUFSIZE)
                if not data:
                    break
                if from_client:
                    if state["server_spoke"]:
                        state["server_spoke"] = False
                        with self._lock:
                            self.requests += 1
                        if self.delay_s > 0 and self._stopping.wait(self.delay_s):
                            break
                else:
                    state["server_spoke"] = True
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # HTTP clients do not half-close: when one side is done, so is the connection.
            self._close(src)
            self._close(dst)

    def _close(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)  # wakes a recv() blocked in the other thread
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass


# --------------------------------------------------------------------------------------------
# Postgres


def _admin_connect(base_uri: str):
    import psycopg  # psycopg 3: SQLAlchemy 2.1's default driver for postgresql:// URIs

    uri = base_uri.replace("postgresql+psycopg://", "postgresql://", 1)
    return psycopg.connect(uri, autocommit=True, connect_timeout=10)


def scratch_postgres_database(base_uri: str, name: str) -> str:
    """Create database `name` (dropping an old one) next to `base_uri`'s; return its URI.

    For a test that needs an empty MLflow schema. Needs CREATEDB for the role (.ci/postgres.sh
    grants it) and psycopg in the test process. Drop it with drop_postgres_database() after
    stopping the servers that use it.
    """
    from psycopg import sql

    with _admin_connect(base_uri) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _with_database(base_uri, name)


def drop_postgres_database(base_uri: str, name: str, patience_s: float = 15.0) -> None:
    """WITH (FORCE) ends the test role's own connections; an autovacuum worker on the fresh
    database belongs to the superuser and cannot be ended by this role, so a drop that meets one
    (InsufficientPrivilege) is tried again once the worker is done."""
    import psycopg
    from psycopg import sql

    deadline = time.monotonic() + patience_s
    with _admin_connect(base_uri) as conn:
        while True:
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                return
            except psycopg.errors.InsufficientPrivilege:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _with_database(uri: str, name: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))
