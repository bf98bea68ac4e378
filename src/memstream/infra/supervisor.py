"""Supervised background loops: a loop that dies is logged, backed off and started again.

Every background loop of a process (the memory outbox relay, hygiene, index maintenance...)
runs under :func:`supervise`. Before, a loop that met an error it did not expect (a Postgres
outage surfacing as ``asyncpg.InterfaceError``) ended its task silently and stayed dead
until the process restarted (issue 12, defect 3). Now:

- the loop is built anew by its factory and awaited; if it returns or raises, the error is
  logged with its traceback, and it is started again after a backoff (``min_backoff``
  doubling to ``max_backoff``; reset once a run lasted ``healthy_after_s``);
- its state is kept in a :class:`LoopStates` registry, one :class:`LoopState` per name.

``LoopStates.snapshot()`` is the stable shape exposed to operators (``/healthz`` and the
console read it; see ``docs/operations.md``)::

    {"outbox-relay": {"state": "running" | "backoff" | "waiting" | "stopped",
                      "restarts": 0, "last_error": null | "ConnectionDoesNotExistError: ...",
                      "since": 1764600000.0, "waiting_for": null | "postgres",
                      "busy_since": null | 1764600100.0, "busy_with": null | "one batch"}}

``waiting`` is a loop paused on a dependency that is away (a stream processor during a
Postgres or Valkey outage: it retries the same batch, dead-letters nothing), ``waiting_for``
names the dependency; ``backoff`` is a loop that failed and is started again. ``busy_since``
is when the unit of work in hand began and ``busy_with`` what it is (a stream processor's
batch, or its offset commit), None between them: a loop ``running`` but on one batch for
minutes is stuck in it, which ``state`` alone would not say (described ``running, one batch
for 196s`` once past :data:`BUSY_SHOWN_AFTER_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["LoopState", "LoopStates", "describe_snapshot", "supervise"]

log = logging.getLogger(__name__)

BUSY_SHOWN_AFTER_S = 30.0
"""A unit of work in hand this long is named in a loop's description."""

State = Literal["running", "backoff", "waiting", "stopped"]


@dataclass(slots=True)
class LoopState:
    """What one supervised loop is doing now."""

    state: State = "running"
    restarts: int = 0
    last_error: str | None = None
    since: float = field(default_factory=time.time)
    #: the dependency a ``waiting`` loop waits for (``postgres``, ``valkey``...)
    waiting_for: str | None = None
    #: wall time the unit of work in hand began (None: between units)
    busy_since: float | None = None
    #: what that unit of work is (``one batch``, ``a commit``)
    busy_with: str | None = None

    def working(self, what: str = "one batch") -> None:
        """A unit of work (a processor's batch, its commit) begins."""
        self.busy_since, self.busy_with = time.time(), what

    def idle(self) -> None:
        """The unit of work in hand ended (done, failed or sought back)."""
        self.busy_since = self.busy_with = None

    def failed(self, error: BaseException | str) -> None:
        """A loop that retries by itself met an error: it is backing off (readiness shows
        it) until :meth:`recovered`. Counted in ``restarts``."""
        self.state, self.since, self.last_error = "backoff", time.time(), _text(error)
        self.waiting_for = None
        self.restarts += 1

    def waiting(self, dependency: str, error: BaseException | str) -> None:
        """The loop is paused until ``dependency`` is back (it retries the same work; not a
        restart). ``since`` keeps the start of the wait."""
        if self.state != "waiting" or self.waiting_for != dependency:
            self.state, self.since, self.waiting_for = "waiting", time.time(), dependency
        self.last_error = _text(error)

    def recovered(self) -> None:
        """The loop works again (no-op while it is running)."""
        if self.state != "running":
            self.state, self.since, self.waiting_for = "running", time.time(), None

    def describe(self) -> str:
        """``running``, ``backoff``, ``waiting for postgres``, ``stopped``, ``running, one
        batch for 196s``."""
        return describe_snapshot(self.to_dict())

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "since": self.since,
            "waiting_for": self.waiting_for,
            "busy_since": self.busy_since,
            "busy_with": self.busy_with,
        }


def describe_snapshot(snap: Mapping[str, object], now: float | None = None) -> str:
    """:meth:`LoopState.describe` of one :meth:`LoopStates.snapshot` entry (read back from
    ``/readyz``): ``running``, ``waiting for postgres``, ``running, one batch for 196s``..."""
    state, dep, busy = snap.get("state"), snap.get("waiting_for"), snap.get("busy_since")
    if state == "waiting" and isinstance(dep, str) and dep:
        return f"waiting for {dep}"
    text = str(state) if isinstance(state, str) else "unknown"
    if isinstance(busy, int | float):
        held = (time.time() if now is None else now) - busy
        if held >= BUSY_SHOWN_AFTER_S:
            what = snap.get("busy_with")
            text += f", {what if isinstance(what, str) else 'busy'} for {held:.0f}s"
    return text


def _text(error: BaseException | str) -> str:
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


class LoopStates:
    """Registry of the supervised loops of one process (built by the composition root)."""

    def __init__(self) -> None:
        self._states: dict[str, LoopState] = {}

    def get(self, name: str) -> LoopState:
        return self._states.setdefault(name, LoopState())

    def snapshot(self) -> dict[str, dict[str, object]]:
        """``{name: {"state", "restarts", "last_error", "since", "waiting_for"}}``."""
        return {name: s.to_dict() for name, s in sorted(self._states.items())}

    def all_running(self) -> bool:
        return all(s.state == "running" for s in self._states.values())

    def problem(self) -> str | None:
        """``None`` when every loop runs; else the loops that do not, and why (readiness)."""
        bad = [
            f"{name} {s.describe()}" + (f" ({s.last_error})" if s.last_error else "")
            for name, s in sorted(self._states.items())
            if s.state != "running"
        ]
        return "; ".join(bad) if bad else None


async def _run_supervised(
    name: str,
    factory: Callable[[], Awaitable[None]],
    st: LoopState,
    min_backoff: float,
    max_backoff: float,
    healthy_after_s: float,
) -> None:
    backoff = min_backoff
    while True:
        st.state, st.since, st.waiting_for = "running", time.time(), None
        started = time.monotonic()
        try:
            await factory()
            error = "the loop returned"
            log.error("background loop %s returned; restarting it in %.1fs", name, backoff)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure: log, back off, start again
            error = f"{type(e).__name__}: {e}"
            log.exception("background loop %s failed; restarting it in %.1fs", name, backoff)
        if time.monotonic() - started >= healthy_after_s:
            backoff = min_backoff
        st.state, st.since, st.last_error = "backoff", time.time(), error
        st.waiting_for = None
        await asyncio.sleep(backoff)
        st.restarts += 1
        backoff = min(max_backoff, backoff * 2)
        log.info("background loop %s: restart %d", name, st.restarts)


def supervise(
    name: str,
    factory: Callable[[], Awaitable[None]],
    states: LoopStates,
    *,
    min_backoff: float = 0.5,
    max_backoff: float = 30.0,
    healthy_after_s: float = 60.0,
) -> Callable[[], Awaitable[None]]:
    """Start ``factory()`` as a supervised task named ``name``; return its async stopper."""
    st = states.get(name)
    task = asyncio.create_task(
        _run_supervised(name, factory, st, min_backoff, max_backoff, healthy_after_s), name=name
    )

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        st.state, st.since = "stopped", time.time()

    return stop
