"""Readiness checks of a :class:`~memstream.infra.cli.wiring.Stack` (``/healthz``, ``/readyz``).

Registers, for what this process built, one part each (``infra/readiness.py``):

============  =====================================================  ======================
part          check                                                  kind
============  =====================================================  ======================
journal       the writer is open, not fenced, its committer running  flag
postgres      ``SELECT 1`` on a dedicated connection                 probe (2 s)
redis         ``PING``                                               probe (2 s)
kafka         the broker answers a Metadata request                  probe (4 s)
clickhouse    ``SELECT 1`` on the message store's engine             probe (5 s: in-process,
                                                                     queued behind writes)
qdrant        a count on the recall index's backend                  probe (5 s)
object_store  a HEAD on the summary store                            probe (3 s)
loops         every supervised background loop is ``running``        flag
============  =====================================================  ======================

and, under ``memstream up``, each embedded server's keeper as a flag of its part (postgres,
redis, kafka): ``restarting`` or ``failed`` make the part not ready.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import asyncpg

from memstream.infra.readiness import Readiness

if TYPE_CHECKING:
    from memstream.infra.cli.wiring import Stack
    from memstream.infra.embedded.base import EmbeddedServer

__all__ = ["SERVER_PART", "unkept_servers", "wire_readiness"]

#: embedded server name -> the readiness part it serves
SERVER_PART = {"postgres": "postgres", "valkey": "redis", "kafka": "kafka", "tansu": "kafka"}


class PostgresProbe:
    """``SELECT 1`` on one connection of its own (never waits for a busy pool)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None

    async def __call__(self) -> None:
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn, timeout=2)
            await self._conn.fetchval("SELECT 1")
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.terminate()


class KafkaProbe:
    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap

    async def __call__(self) -> None:
        from memstream.infra.embedded.kafka import metadata_answers

        if not await metadata_answers(self._bootstrap):
            raise ConnectionError(f"the broker at {self._bootstrap} answers no Metadata request")


def wire_readiness(stack: Stack, *, kafka: bool) -> Readiness:
    """Register the checks of what ``stack`` built into ``stack.services.readiness``."""
    svc = stack.services
    assert svc is not None
    r = svc.readiness
    s = stack.settings
    if stack.journal is not None:
        r.add_flag("journal", stack.journal.problem)
    if stack.pool is not None:
        pg = PostgresProbe(s.postgres_dsn.get_secret_value())
        r.add_probe("postgres", pg)
        stack.on_stop(pg.close)
    if stack.redis is not None:
        redis = stack.redis

        async def ping() -> None:
            await redis.ping()

        r.add_probe("redis", ping)
    if kafka and s.kafka_bootstrap:
        r.add_probe("kafka", KafkaProbe(s.kafka_bootstrap), timeout_s=4.0)
    if svc.message_store is not None:
        engine = svc.message_store.engine

        async def select_one() -> None:
            await engine.rows("SELECT 1", {})

        r.add_probe("clickhouse", select_one, timeout_s=5.0)
    if stack.memory_index is not None:
        backend = stack.memory_index.backend

        async def count() -> None:
            await backend.count("memstream-readiness-probe")

        r.add_probe("qdrant", count, timeout_s=5.0)
    if svc.summary_store is not None:
        r.add_probe("object_store", svc.summary_store.ping, timeout_s=3.0)
    r.add_flag("loops", svc.loops.problem)
    r.add_section("loops", svc.loops.snapshot)
    r.add_section("relays", partial(relay_backlogs, stack))
    servers = None
    if stack.keepers is not None:
        for keeper in stack.keepers:
            r.add_flag(SERVER_PART.get(keeper.name, keeper.name), keeper.problem)
        r.add_section("servers", stack.keepers.snapshot)
        servers = stack.keepers.snapshot
    elif stack.servers:
        servers = partial(unkept_servers, list(stack.servers))
    # /metrics: memstream_loop_state, memstream_server_up, memstream_ready... (infra.metrics)
    if svc.metrics is not None:
        svc.metrics.track_states(loops=svc.loops.snapshot, servers=servers, parts=r.parts)
    return r


def relay_backlogs(stack: Stack) -> dict[str, int]:
    """What this process's relays have not published yet: ``{"journal": n}`` while the
    journal relay runs here (read by ``memstream lag``; the memory outbox's backlog is a
    row count any process reads from Postgres)."""
    relay = stack.journal_relay  # set once the pipeline started, after the wiring
    return {} if relay is None else {"journal": relay.backlog}


def unkept_servers(servers: Sequence[EmbeddedServer]) -> dict[str, dict[str, object]]:
    """The embedded servers' states without keepers (restarts off): running or stopped."""
    return {
        s.name: {"state": "running" if s.running else "stopped", "restarts": 0} for s in servers
    }
