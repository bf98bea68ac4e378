"""Readiness: whether each part a process runs is usable now (``/healthz``, ``/readyz``).

Liveness (``/livez``) only says the process answers. Readiness names every part and its real
state (issue 12, defect 4: ``/healthz`` answered 200 with the broker, Postgres or the journal
writer dead). A *part* (``journal``, ``postgres``, ``redis``, ``kafka``, ``clickhouse``,
``qdrant``, ``object_store``, ``loops``) is ready when every check registered for it passes:

- a **probe** is an I/O round trip (``SELECT 1``, ``PING``, a Metadata request...) that
  raises when the part is not usable. Probes run in the background every ``interval_s``
  (concurrently, each bounded by its timeout), so a request never waits on a dead store:
  it reads the last results. A probe still unanswered after its timeout fails the part
  ("no answer for 3.0s"); it is not started again until it returns, so a stuck engine is
  not flooded. A result older than ``3 * interval_s`` (the monitor itself stalled) fails
  the part too. Without a running monitor (an app built by hand, as in tests) the probes
  run on demand, once per ``interval_s`` at most.
- a **flag** is a cheap in-process reading, evaluated at every request: ``None`` means ok,
  a string says what is wrong (the journal writer is fenced, a background loop is backing
  off, an embedded server is restarting or was given up on).

:meth:`Readiness.report` is the wire shape (``schemas.wire.Health``)::

    {"ok": false, "status": "not_ready", "failing": ["postgres"],
     "parts": {"journal": true, "postgres": false, ...},
     "errors": {"postgres": "ConnectionRefusedError: ..."},
     "loops": {...LoopStates.snapshot()}, "servers": {...Keepers.snapshot()}}

Pure of any store: the composition root (``infra.cli.readiness_wiring``) registers the
probes and flags of what it built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["Flag", "Probe", "Readiness"]

log = logging.getLogger(__name__)

#: raises when the part is not usable (its message is reported)
Probe = Callable[[], Awaitable[object]]
#: ``None`` when fine, else what is wrong
Flag = Callable[[], str | None]
#: extra sections of the report (``loops``, ``servers``): a JSON-able snapshot
Section = Callable[[], object]


def describe(exc: BaseException) -> str:
    """One line naming an error: ``ConnectionRefusedError: [Errno 111] ...``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


@dataclass(slots=True)
class _ProbeState:
    probe: Probe
    timeout_s: float
    error: str | None = "not checked yet"
    checked_at: float | None = None  # monotonic time of the last answer
    task: asyncio.Task[None] | None = None
    started_at: float = 0.0


@dataclass(slots=True)
class _Part:
    probes: list[_ProbeState] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)


class Readiness:
    """The readiness checks of one process. Coroutine-safe within one event loop."""

    def __init__(self, *, interval_s: float = 1.0, timeout_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._parts: dict[str, _Part] = {}
        self._sections: dict[str, Section] = {}
        self._monitor: asyncio.Task[None] | None = None
        self._refreshed_at: float | None = None
        self._refreshing: asyncio.Lock | None = None

    # --- registration ---------------------------------------------------------------------
    def add_probe(self, part: str, probe: Probe, *, timeout_s: float | None = None) -> None:
        self._parts.setdefault(part, _Part()).probes.append(
            _ProbeState(probe, self.timeout_s if timeout_s is None else timeout_s)
        )

    def add_flag(self, part: str, flag: Flag) -> None:
        self._parts.setdefault(part, _Part()).flags.append(flag)

    def add_section(self, name: str, section: Section) -> None:
        """An extra top-level key of the report (informative; never fails readiness)."""
        self._sections[name] = section

    @property
    def part_names(self) -> list[str]:
        return sorted(self._parts)

    # --- probing --------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Start every probe that is not in flight and wait for them, each up to its
        timeout; one still running after it is reported as not answering."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            states = [st for part in self._parts.values() for st in part.probes]
            now = time.monotonic()
            for st in states:
                if st.task is None or st.task.done():
                    st.started_at = now
                    st.task = asyncio.create_task(self._run_probe(st), name="readiness-probe")
            waits = [st.task for st in states if st.task is not None and not st.task.done()]
            if waits:
                longest = max(st.timeout_s for st in states)
                await asyncio.wait(waits, timeout=longest)
            now = time.monotonic()
            for st in states:
                late = now - st.started_at >= st.timeout_s
                if st.task is not None and not st.task.done() and late:
                    st.error = f"no answer for {now - st.started_at:.1f}s"
                    st.checked_at = now
            self._refreshed_at = now

    @staticmethod
    async def _run_probe(st: _ProbeState) -> None:
        try:
            async with asyncio.timeout(st.timeout_s):
                await st.probe()
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            st.error = f"no answer within {st.timeout_s:.1f}s"
        except Exception as e:  # noqa: BLE001 - any failure makes the part not ready
            st.error = describe(e)
        else:
            st.error = None
        st.checked_at = time.monotonic()

    async def _monitor_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let readiness die silently
                log.exception("readiness refresh failed")
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        """Probe once now, then in the background every ``interval_s``."""
        if self._monitor is not None:
            return
        await self.refresh()
        self._monitor = asyncio.create_task(self._monitor_loop(), name="readiness-monitor")

    async def stop(self) -> None:
        tasks = [self._monitor] if self._monitor is not None else []
        self._monitor = None
        tasks += [
            st.task
            for part in self._parts.values()
            for st in part.probes
            if st.task is not None and not st.task.done()
        ]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # --- reading --------------------------------------------------------------------------
    def _stale(self, st: _ProbeState, now: float) -> str | None:
        if st.checked_at is None:
            return st.error or "not checked yet"
        age = now - st.checked_at
        if age > 3 * self.interval_s + st.timeout_s:
            return f"last checked {age:.0f}s ago"
        return st.error

    def errors(self) -> dict[str, list[str]]:
        """Per part, what is wrong now (an empty list: ready)."""
        now = time.monotonic()
        out: dict[str, list[str]] = {}
        for name, part in sorted(self._parts.items()):
            problems = [e for st in part.probes if (e := self._stale(st, now)) is not None]
            for flag in part.flags:
                try:
                    why = flag()
                except Exception as e:  # noqa: BLE001 - a broken flag is a failing part
                    why = f"check failed: {describe(e)}"
                if why is not None:
                    problems.append(why)
            out[name] = problems
        return out

    def parts(self) -> dict[str, bool]:
        """``{part: ready}`` from the last results (no I/O)."""
        return {name: not problems for name, problems in self.errors().items()}

    async def report(self) -> dict[str, object]:
        """The readiness report (see the module doc); probes first if no monitor runs."""
        if self._monitor is None and self._due():
            await self.refresh()
        errors = self.errors()
        failing = [name for name, problems in errors.items() if problems]
        out: dict[str, object] = {
            "ok": not failing,
            "status": "ready" if not failing else "not_ready",
            "failing": failing,
            "parts": {name: not problems for name, problems in errors.items()},
            "errors": {name: "; ".join(problems) for name, problems in errors.items() if problems},
        }
        for name, section in self._sections.items():
            try:
                out[name] = section()
            except Exception as e:  # noqa: BLE001 - informative only
                out[name] = {"error": describe(e)}
        return out

    def _due(self) -> bool:
        at = self._refreshed_at
        return at is None or time.monotonic() - at >= self.interval_s
