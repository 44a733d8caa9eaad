"""LocalRedisServer: a throwaway redis-server on a free loopback port.

For tests, benchmarks (perf/) and demos: ``with LocalRedisServer() as server:``
starts ``redis-server`` bound to 127.0.0.1 only, in a temporary directory, with
persistence off (no RDB saves, no AOF), waits until it answers PING, and on exit
kills it and removes the directory. ``server.url`` is the ``redis://`` URL of
database 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref

__all__ = ["LocalRedisServer", "RedisServerError"]

#: Environment variable naming the redis-server binary (default: found on PATH).
BINARY_ENV = "AEC_REDIS_SERVER"


class RedisServerError(RuntimeError):
    """redis-server would not start (it exited, or never answered PING in time)."""


class LocalRedisServer:
    """A private ``redis-server`` process on 127.0.0.1 (context manager).

    Args:
        binary: the redis-server executable; default ``$AEC_REDIS_SERVER`` or
            ``redis-server`` on PATH.
        startup_timeout: seconds to wait for the first PONG.
        extra_args: more ``redis-server`` command-line arguments, e.g.
            ``("--maxmemory", "100mb")``.

    ``start()`` raises FileNotFoundError when the binary is missing and
    ``RedisServerError`` (with the end of the server's log) when it exits early
    or does not answer in time. ``stop()`` kills the process (SIGKILL: a crash,
    which is what failure tests want) and removes the directory; it is idempotent
    and also runs when the object is garbage collected or the interpreter exits.
    ``restart()`` kills it and starts an empty one on the same port (a server
    that crashed and came back without persistence).
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        startup_timeout: float = 10.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.binary = binary or os.environ.get(BINARY_ENV) or "redis-server"
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.port: int | None = None
        self.directory: str | None = None
        self._process: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None

    def __repr__(self) -> str:
        state = f"port {self.port}" if self.running else "stopped"
        return f"LocalRedisServer({state})"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``; raises RuntimeError before ``start()``."""
        if self.port is None:
            raise RuntimeError("LocalRedisServer is not started")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def __enter__(self) -> LocalRedisServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalRedisServer:
        """Start the server and wait for PONG; a second call does nothing."""
        if self.running:
            return self
        self.stop()  # a previous, dead process: clean it up first
        path = shutil.which(self.binary)
        if path is None:
            raise FileNotFoundError(
                f"redis-server not found ({self.binary!r} is not an executable on PATH); "
                f"install it (Debian: apt-get install redis-server) or set ${BINARY_ENV}"
            )
        last_error: Exception | None = None
        for _attempt in range(3):  # a free port may be taken before redis binds it
            try:
                self._launch(path)
                return self
            except RedisServerError as exc:
                last_error = exc
                port_taken = "Address already in use" in str(exc)
                self.stop()
                if not port_taken:
                    raise
        raise RedisServerError(f"could not start redis-server: {last_error}") from last_error

    def restart(self) -> LocalRedisServer:
        """Kill the server (SIGKILL, by its PID) and start a new, empty one on the same
        port; raises RedisServerError when the port cannot be bound again."""
        port = self.port
        if port is None:
            raise RuntimeError("LocalRedisServer is not started")
        self.stop()
        path = shutil.which(self.binary)
        if path is None:
            raise FileNotFoundError(f"redis-server not found ({self.binary!r})")
        self._launch(path, port)
        return self

    def _launch(self, path: str, port: int | None = None) -> None:
        self.directory = tempfile.mkdtemp(prefix="aec-redis-")
        self.port = _free_port() if port is None else port
        log = os.path.join(self.directory, "redis.log")
        args = [
            path,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--dir", self.directory,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            # a restore's DUMP payloads come from checkpoint files: the server checks
            # them whole (a crafted one is refused, not decoded until it crashes)
            "--sanitize-dump-payload", "yes",
            "--logfile", log,
            *self.extra_args,
        ]  # fmt: skip
        output = os.path.join(self.directory, "redis.out")  # errors before the log opens
        with open(output, "wb") as out:
            self._process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.directory,
            )  # fmt: skip
        self._finalizer = weakref.finalize(self, _cleanup, self._process, self.directory)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise RedisServerError(
                    f"redis-server exited with status {code} on port {self.port}: "
                    f"{_tail(output)} {_tail(log)}"
                )
            if _answers_ping(self.port):
                return
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server on port {self.port} did not answer PING within "
                    f"{self.startup_timeout} s: {_tail(output)} {_tail(log)}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server and remove its directory. Idempotent."""
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer()
        elif self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self._process = None
        self.directory = None


def _cleanup(process: subprocess.Popen, directory: str) -> None:
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a kernel that will not reap
        pass
    shutil.rmtree(directory, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, errors="replace") as log:
            text = log.read().strip().splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(text)
