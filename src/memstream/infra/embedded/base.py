"""The shared base of every embedded server launcher (Kafka, Tansu, Postgres, Valkey...).

An :class:`EmbeddedServer` owns one child process: it picks a free port (or checks that the
chosen one is free), keeps the server's data and log under its ``data_dir``, waits until the
server answers, and stops it cleanly (SIGTERM to the process group, then SIGKILL after a
grace period). When the server cannot start, :class:`memstream.errors.ServerStartError` says
which binary, which port, and shows the last lines of the server's log.

Guarantees:

* ``start()`` returns only once :meth:`EmbeddedServer.is_ready` said yes; otherwise it raises
  ``ServerStartError`` and leaves no process behind.
* ``stop()`` is idempotent and never leaves the child (or its children) running.
* On Linux the child gets ``PR_SET_PDEATHSIG=SIGKILL``: if this Python process dies without
  calling ``stop()``, the server dies with it (no orphan servers after a crashed test run).

Subclasses provide :meth:`command` (argv) and may override :meth:`prepare` (one-off set-up
such as formatting storage), :meth:`is_ready` (default: a TCP connect to the port) and
:meth:`environment`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import pwd
import signal
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from memstream.errors import ServerStartError

__all__ = ["EmbeddedServer", "free_port", "port_is_free", "tail"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` and it can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a port in TIME_WAIT after our own server stopped is reusable.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def tail(path: Path, lines: int = 30, *, start: int = 0) -> str:
    """The last ``lines`` lines of a log file, read from byte ``start`` on ("" if absent)."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            last: deque[bytes] = deque(f, maxlen=lines)
    except OSError:
        return ""
    return b"".join(last).decode("utf-8", "replace").rstrip()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_setup(uid: int | None) -> Callable[[], None]:
    """What the child runs between fork and exec: become ``uid`` (as ``Popen(user=)`` does:
    the real and effective uid; uvloop's ``subprocess_exec`` has no ``user=``), then ask to
    die with its parent (after the switch: a credential change clears the death signal)."""

    def setup() -> None:  # pragma: no cover - runs in the child between fork and exec
        if uid is not None:
            os.setreuid(uid, uid)
        _die_with_parent()

    return setup


async def tcp_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` succeeds within ``timeout`` seconds."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class EmbeddedServer(ABC):
    """One embedded server process. Use ``async with`` or ``await start()`` / ``await stop()``."""

    #: short name used in logs, errors and the log file name
    name: str = "server"
    #: seconds between readiness probes
    probe_interval: float = 0.05
    #: seconds between SIGTERM and SIGKILL
    stop_grace: float = 10.0

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 60.0,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.host = host
        self.requested_port = port
        self.port: int = port or 0
        self.startup_timeout = startup_timeout
        self._proc: asyncio.subprocess.Process | None = None
        self._log_file = self.data_dir / f"{self.name}.log"
        self._log_start = 0
        self.startup_seconds: float | None = None

    # --- what subclasses provide -----------------------------------------------------------
    @abstractmethod
    def command(self) -> list[str]:
        """The argv that runs the server in the foreground (``self.port`` is set)."""

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """One-off set-up before launch (e.g. format storage). Default: nothing."""

    def environment(self) -> dict[str, str]:
        """The child's environment. Default: ours."""
        return dict(os.environ)

    def run_as(self) -> str | None:
        """System user to run the child as (Postgres refuses root). Default: ourselves."""
        return None

    async def is_ready(self) -> bool:
        """True once the server serves requests. Default: a TCP connect to the port."""
        return await tcp_answers(self.host, self.port)

    # --- public surface ---------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``host:port`` of the running server."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        return self._log_file

    def last_log_lines(self, lines: int = 30) -> str:
        """The server's last log lines from this run."""
        return tail(self._log_file, lines, start=self._log_start)

    async def start(self) -> Self:
        """Launch the server and wait until it is ready; raise ServerStartError otherwise."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.requested_port:
            self.port = self.requested_port
            if not port_is_free(self.port, self.host):
                raise self._error(f"port {self.port} on {self.host} is already in use")
        else:
            self.port = free_port(self.host)
        started = time.monotonic()
        await self.prepare()
        argv = self.command()
        user = self.run_as()
        uid = pwd.getpwnam(user).pw_uid if user is not None else None
        self._log_start = self._log_file.stat().st_size if self._log_file.exists() else 0
        log.info("starting %s on %s: %s", self.name, self.address, " ".join(argv))
        with self._log_file.open("ab") as out:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=self.data_dir,
                    env=self.environment(),
                    start_new_session=True,
                    preexec_fn=_child_setup(uid),  # noqa: PLW1509 - tiny, async-signal-safe
                )
            except OSError as exc:
                raise self._error(f"cannot execute {argv[0]}: {exc}") from exc
        try:
            await self._wait_ready(started)
        except BaseException:
            await self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("%s ready on %s in %.2fs", self.name, self.address, self.startup_seconds)
        return self

    async def stop(self) -> None:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``stop_grace``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        self._signal(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.stop_grace)
        except TimeoutError:
            log.warning("%s (pid %s) ignored SIGTERM; killing it", self.name, proc.pid)
            self._signal(proc, signal.SIGKILL)
            await proc.wait()
        log.info("%s on %s stopped (exit %s)", self.name, self.address, proc.returncode)

    async def wait_exit(self) -> int | None:
        """Wait until the running process exits (at once when none runs); its exit code."""
        proc = self._proc
        if proc is None:
            return None
        return await proc.wait()

    async def restart(self) -> Self:
        """Start again **on the same port and data dir** (after a crash: clients reconnect
        to the address they have). Stops the old process first if it still runs."""
        if self.running:
            await self.stop()
        if self.port:
            self.requested_port = self.port
        return await self.start()

    async def kill(self) -> None:
        """Stop the server abruptly (SIGKILL), as a crash would."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        self._signal(proc, signal.SIGKILL)
        await proc.wait()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- internals --------------------------------------------------------------------------
    async def _wait_ready(self, started: float) -> None:
        deadline = started + self.startup_timeout
        while True:
            proc = self._proc
            if proc is None or proc.returncode is not None:
                code = proc.returncode if proc is not None else None
                raise self._error(f"exited with code {code} before becoming ready")
            if await self.is_ready():
                return
            if time.monotonic() > deadline:
                raise self._error(f"not ready after {self.startup_timeout:.0f}s")
            await asyncio.sleep(self.probe_interval)

    def _error(self, reason: str) -> ServerStartError:
        binary = self.command_binary()
        lines = self.last_log_lines()
        msg = f"{self.name} ({binary}) could not start on {self.host}:{self.port}: {reason}"
        if lines:
            msg += f"\n--- last lines of {self._log_file} ---\n{lines}"
        return ServerStartError(msg)

    def command_binary(self) -> str:
        """The executable named in errors."""
        try:
            return self.command()[0]
        except Exception:  # noqa: BLE001 - only used to describe an error
            return self.name

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
