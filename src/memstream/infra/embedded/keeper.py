"""Keep embedded servers alive: restart a child server that died, a bounded number of times.

``memstream up`` runs Postgres, Valkey and a Kafka broker as child processes. A
:class:`ServerKeeper` watches one started :class:`~memstream.infra.embedded.base.EmbeddedServer`;
when its process exits without being asked to (a crash, ``kill -9``, the OOM killer), the
keeper starts it again **on the same port and data dir** (:meth:`EmbeddedServer.restart`),
so every client (asyncpg pools, Redis clients, Kafka producers and consumers) reconnects to
the address it already has.

Rules (:class:`RestartPolicy`):

- each start attempt waits a backoff first (``min_backoff_s`` doubling to
  ``max_backoff_s``), and is logged; an attempt that fails (``ServerStartError``) is logged
  with the reason and retried;
- at most ``max_tries`` attempts per incident. Attempts are counted since the server was
  last up for ``healthy_after_s``, so a server that crashes again right after each restart
  (a crash loop) also runs out of tries. Then the keeper **gives up loudly**: an error log
  line naming the server, its port, its log file and its last log lines; its state becomes
  ``failed`` (readiness reports it, ``/healthz`` answers 503) and it stays down;
- after a successful restart, ``on_restart`` runs (the composition root uses it to
  re-create topics and re-check the journal relay after a broker restart); its errors are
  logged, never fatal.

State (:attr:`ServerKeeper.state`, :meth:`Keepers.snapshot`, one stable shape)::

    {"postgres": {"state": "running" | "restarting" | "failed" | "stopped",
                  "restarts": 1, "tries": 0, "last_error": null | "...",
                  "since": 1764600000.0, "port": 5432, "pid": 1234}}

Use (the chaos tests do the same)::

    keepers = Keepers(RestartPolicy(max_tries=5))
    keeper = keepers.watch(server)          # server already started
    os.kill(server.pid, signal.SIGKILL)     # a crash
    assert await keeper.wait_restarted(1, timeout=60)   # back, same port
    await keeper.pause()                    # stop watching (e.g. to keep it down)
    keeper.resume()                         # watch again; restarts it now if it is down
    await keepers.stop()                    # stop watching all (servers keep running)

Stopping: stop the keepers *before* the servers (``Stack`` registers them so), or the keeper
would restart a server that is being stopped on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from memstream.errors import ServerStartError
from memstream.infra.embedded.base import EmbeddedServer

__all__ = ["Keepers", "RestartPolicy", "ServerKeeper", "ServerState"]

log = logging.getLogger(__name__)

Status = Literal["running", "restarting", "failed", "stopped"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How a dead server is restarted (see the module doc)."""

    max_tries: int = 5
    min_backoff_s: float = 0.5
    max_backoff_s: float = 15.0
    healthy_after_s: float = 60.0

    def backoff(self, attempt: int) -> float:
        """Wait before the ``attempt``-th try of an incident (1-based)."""
        return float(min(self.max_backoff_s, self.min_backoff_s * 2 ** (attempt - 1)))


@dataclass(slots=True)
class ServerState:
    """What one kept server is doing now."""

    state: Status = "running"
    restarts: int = 0  # successful restarts since the keeper started
    tries: int = 0  # attempts in the current incident
    last_error: str | None = None
    since: float = field(default_factory=time.time)
    port: int = 0
    pid: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "restarts": self.restarts,
            "tries": self.tries,
            "last_error": self.last_error,
            "since": self.since,
            "port": self.port,
            "pid": self.pid,
        }


class ServerKeeper:
    """Watches one started server and restarts it when it dies (see the module doc)."""

    def __init__(
        self,
        server: EmbeddedServer,
        policy: RestartPolicy | None = None,
        *,
        on_restart: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.server = server
        self.policy = policy or RestartPolicy()
        self.on_restart = on_restart
        self.state = ServerState(port=server.port, pid=server.pid)
        self._task: asyncio.Task[None] | None = None
        self._up_since = time.monotonic()
        self._changed = asyncio.Event()

    @property
    def name(self) -> str:
        return self.server.name

    def problem(self) -> str | None:
        """``None`` while the server runs; else what is wrong (for readiness)."""
        st = self.state
        if st.state == "running":
            return None
        if st.state == "restarting":
            return (
                f"embedded {self.name} died; restarting it on port {st.port} "
                f"(try {st.tries} of {self.policy.max_tries}): {st.last_error}"
            )
        if st.state == "failed":
            return (
                f"embedded {self.name} died and could not be restarted after "
                f"{st.tries} tries: {st.last_error} (see {self.server.log_path})"
            )
        return f"embedded {self.name} is stopped"

    # --- lifecycle ------------------------------------------------------------------------
    def resume(self) -> None:
        """Watch the server (restarting it at once if it is down). Idempotent."""
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.create_task(self._watch(), name=f"keeper-{self.name}")

    async def pause(self) -> None:
        """Stop watching; the server is left as it is."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.state.state != "failed":
            self._set("running" if self.server.running else "stopped")

    async def wait_restarted(self, restarts: int, timeout: float) -> bool:
        """Wait until ``state.restarts >= restarts`` with the server running; False on
        timeout or once the keeper gave up."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    changed = self._changed
                    if self.state.restarts >= restarts and self.state.state == "running":
                        return True
                    if self.state.state == "failed":
                        return False
                    await changed.wait()
        except TimeoutError:
            return False

    # --- the watch ------------------------------------------------------------------------
    def _set(self, state: Status, error: str | None = None) -> None:
        st = self.state
        st.state, st.since = state, time.time()
        if error is not None:
            st.last_error = error
        st.port, st.pid = self.server.port, self.server.pid
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _watch(self) -> None:
        while True:
            if self.server.running:
                self._set("running")
                code = await self.server.wait_exit()
                self.state.tries = 0 if self._healthy() else self.state.tries
                log.error(
                    "embedded %s (port %d) exited unexpectedly (exit code %s); restarting it",
                    self.name,
                    self.server.port,
                    code,
                )
                self._set("restarting", f"exited with code {code}")
            elif self._healthy():
                self.state.tries = 0
            if not await self._restart():
                return

    def _healthy(self) -> bool:
        return time.monotonic() - self._up_since >= self.policy.healthy_after_s

    async def _restart(self) -> bool:
        p = self.policy
        while self.state.tries < p.max_tries:
            self.state.tries += 1
            wait = p.backoff(self.state.tries)
            self._set("restarting")
            log.warning(
                "embedded %s: restart try %d of %d in %.1fs (port %d, data %s)",
                self.name,
                self.state.tries,
                p.max_tries,
                wait,
                self.server.port,
                self.server.data_dir,
            )
            await asyncio.sleep(wait)
            try:
                await self.server.restart()
            except ServerStartError as e:
                first = e.message.splitlines()[0]
                self._set("restarting", first)
                log.error(
                    "embedded %s: restart try %d failed: %s", self.name, self.state.tries, first
                )
                continue
            self._up_since = time.monotonic()
            self.state.restarts += 1
            self._set("running")
            log.warning(
                "embedded %s restarted on port %d (pid %s, restart %d)",
                self.name,
                self.server.port,
                self.server.pid,
                self.state.restarts,
            )
            if self.on_restart is not None:
                try:
                    await self.on_restart()
                except Exception:  # noqa: BLE001 - the server is back; the hook is best effort
                    log.exception("embedded %s: after-restart hook failed", self.name)
            return True
        self._set("failed")
        log.error(
            "embedded %s: GAVE UP after %d restart tries on port %d; it stays down and "
            "memstream is not ready (GET /healthz answers 503). Last error: %s. "
            "Log: %s\n%s",
            self.name,
            self.state.tries,
            self.server.port,
            self.state.last_error,
            self.server.log_path,
            self.server.last_log_lines(15),
        )
        return False


class Keepers:
    """The keepers of one process's embedded servers."""

    def __init__(self, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self._keepers: dict[str, ServerKeeper] = {}

    def watch(
        self,
        server: EmbeddedServer,
        *,
        on_restart: Callable[[], Awaitable[None]] | None = None,
    ) -> ServerKeeper:
        """Start keeping ``server`` (already started) alive."""
        keeper = ServerKeeper(server, self.policy, on_restart=on_restart)
        self._keepers[server.name] = keeper
        keeper.resume()
        return keeper

    def get(self, name: str) -> ServerKeeper:
        return self._keepers[name]

    def __iter__(self) -> Iterator[ServerKeeper]:
        return iter(list(self._keepers.values()))

    def snapshot(self) -> dict[str, dict[str, object]]:
        return {name: k.state.to_dict() for name, k in sorted(self._keepers.items())}

    async def stop(self) -> None:
        """Stop watching every server (they keep running; stop them afterwards)."""
        for keeper in list(self._keepers.values()):
            await keeper.pause()
