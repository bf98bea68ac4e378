"""The memory outbox relay: Postgres ``memory_outbox`` → the Kafka ``memory`` topic.

Guarantees:

- **Nothing lost**: a row is marked published only after the bus acknowledged it
  (``publish_many`` returns once every record is acknowledged). While Kafka is down the
  rows wait in Postgres, and the relay retries with a capped backoff.
- **At least once**: a crash between the acknowledgement and the mark re-publishes the same
  bytes (same event ids); consumers dedupe by event id / entry version.
- **Order**: rows are drained in id order and published keyed ``account/agent``
  (``schemas.topics.memory_key``); the bus keeps per-key order. Changes to one entry are
  serialised by its row lock, so their outbox ids — and so their order on the topic —
  follow the order of the changes.
- **Sealed** (with ``keyring``, as ``memstream up`` wires it): an event whose entry has a
  user and content is encrypted with that user's data key (``infra/data_keys.py``), so a
  user erasure, which destroys the key, shreds its copies on the topic. While a user's
  erasure runs their key is refused: the relay stops before their first content row until
  the erasure has deleted those rows (it deletes the user's content rows, published or not).
- **One active relay**: a session advisory lock makes every other relay process a standby
  that takes over when the active one's connection goes away. A relay whose lock
  connection died (a Postgres restart ends every session, and the lock with it) stops
  publishing and raises :class:`~memstream.errors.StoreUnavailable`: its supervisor runs
  it again, as a standby or the active relay, with a new ``LISTEN`` (the old one hears
  nothing after the restart).
- **A broker that lost its log** (issue 16 item 4: a fresh broker, Tansu restarted, a wiped
  log dir): with ``broker_records`` (the CLI wiring gives it), :meth:`run` first looks at the
  ``memory`` topic; empty while the outbox still keeps published rows (the last
  ``retention``), those rows are marked unpublished and go out again, in id order, before
  anything newer. The memory projector is idempotent (entry versions), so rows the index
  already had change nothing, and rows the lost broker had not delivered yet are indexed.
  Rows pruned earlier are not re-published (``memstream replay memory`` rebuilds the index
  from Postgres); a log lost only in part (the topic not empty) is not detected.

Wakes on ``NOTIFY`` from the writers (``outbox.OUTBOX_CHANNEL``), and polls every
``poll_interval_s`` as a fallback (a missed notification only delays, never loses).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Protocol

import asyncpg
import orjson

from memstream.agents_ctx.memory.outbox import OUTBOX_CHANNEL, unpublished_count
from memstream.errors import InfraError, StoreUnavailable
from memstream.infra.data_keys import Keyring, memory_scope
from memstream.infra.postgres import keeps_session_state
from memstream.schemas.topics import memory_key

if TYPE_CHECKING:
    from memstream.infra.metrics import Metrics

log = logging.getLogger(__name__)

_RELAY_LOCK: Final = 0x6D656D6F  # "memo"


def _session_gone(conn: asyncpg.Connection) -> bool:
    """The connection's session ended (asyncpg's pool detaches a connection that died from
    its proxy, whose calls then raise)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


class Publisher(Protocol):
    """What the relay needs of the bus (``memstream.infra.kafka.bus.Bus`` has it)."""

    async def publish_many(self, topic: str, records: Iterable[tuple[str, bytes]]) -> int: ...


class OutboxRelay:
    """Drains ``memory_outbox`` to ``topic``. ``await run()`` until cancelled, or call
    ``drain()`` yourself (tests, the CLI)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        bus: Publisher,
        topic: str,
        *,
        batch: int = 500,
        poll_interval_s: float = 1.0,
        max_backoff_s: float = 5.0,
        retention: timedelta = timedelta(days=1),
        metrics: Metrics | None = None,
        keyring: Keyring | None = None,
        broker_records: Callable[[], Awaitable[int | None]] | None = None,
    ) -> None:
        self._broker_records = broker_records
        self._pool = pool
        self._keyring = keyring
        self._bus = bus
        self._topic = topic
        self._batch = batch
        self._poll = poll_interval_s
        self._max_backoff = max_backoff_s
        self._retention = retention
        self._metrics = metrics
        self._wake = asyncio.Event()

    async def publish_batch(self) -> int:
        """Publish the oldest unpublished rows (at most one batch) and mark them.

        Returns how many were published; raises ``InfraError`` if the bus failed (nothing
        is marked then)."""
        rows = await self._pool.fetch(
            "SELECT id, account_id, agent_id, event FROM memory_outbox "
            "WHERE published_at IS NULL ORDER BY id LIMIT $1",
            self._batch,
        )
        if not rows:
            return 0
        values = [bytes(r["event"]) for r in rows]
        if self._keyring is not None:
            sealed = await self._keyring.seal_many(
                [(memory_scope(orjson.loads(v)), v) for v in values]
            )
            # a user being erased has no key until the erasure deleted their rows: publish
            # the rows before the first such one, and the rest on a later pass (keeps order)
            cut = next((i for i, v in enumerate(sealed) if v is None), len(sealed))
            rows, values = rows[:cut], [v for v in sealed[:cut] if v is not None]
            if not rows:
                return 0
        records = [
            (memory_key(r["account_id"], r["agent_id"]), v)
            for r, v in zip(rows, values, strict=True)
        ]
        await self._bus.publish_many(self._topic, records)
        await self._pool.execute(
            "UPDATE memory_outbox SET published_at = now() WHERE id = ANY($1::bigint[])",
            [r["id"] for r in rows],
        )
        return len(rows)

    async def drain(self) -> int:
        """Publish until nothing is pending; returns the count. Raises on a bus failure."""
        total = 0
        while n := await self.publish_batch():
            total += n
        await self._report_backlog()
        return total

    async def republish_if_lost(self) -> int:
        """If the broker lost its log (its ``memory`` topic holds no record while the outbox
        kept published rows), mark those rows unpublished so they go out again. Returns how
        many rows will be re-published (0: nothing lost, or unknown)."""
        if self._broker_records is None:
            return 0
        kept = await self._broker_records()
        if kept is None or kept > 0:
            return 0
        status = await self._pool.execute(
            "UPDATE memory_outbox SET published_at = NULL WHERE published_at IS NOT NULL"
        )
        n = int(status.split()[-1])
        if n:
            log.warning(
                "memory relay: the broker's %s topic is empty but %d outbox rows were "
                "published: it lost its log; re-publishing them (the memory projector is "
                "idempotent; rows pruned before are not re-published: `memstream replay "
                "memory` rebuilds the index from Postgres)",
                self._topic,
                n,
            )
        return n

    async def backlog(self) -> int:
        return await unpublished_count(self._pool)

    async def prune(self) -> int:
        """Delete rows published longer ago than ``retention`` (the topic has them)."""
        status = await self._pool.execute(
            "DELETE FROM memory_outbox WHERE published_at IS NOT NULL "
            "AND published_at < now() - $1::interval",
            self._retention,
        )
        return int(status.split()[-1])

    async def _report_backlog(self) -> None:
        if self._metrics is not None:
            self._metrics.relay_backlog.labels(relay="memory").set(await self.backlog())

    def _notified(self, *_: object) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Hold the relay lock (standby until it is free), then drain on every notification
        or poll tick, backing off while the bus is down. Runs until cancelled."""
        async with self._pool.acquire() as conn:
            keeps_session_state(conn)
            while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _RELAY_LOCK):
                await asyncio.sleep(self._poll)
            await conn.add_listener(OUTBOX_CHANNEL, self._notified)
            try:
                await self.republish_if_lost()
                await self._loop(conn)
            finally:
                with contextlib.suppress(Exception):
                    await conn.remove_listener(OUTBOX_CHANNEL, self._notified)
                    await conn.execute("SELECT pg_advisory_unlock($1)", _RELAY_LOCK)

    async def _loop(self, lock: asyncpg.Connection) -> None:
        backoff = 0.1
        ticks = 0
        while True:
            if _session_gone(lock):
                raise StoreUnavailable(
                    "memory relay: its lock connection to Postgres is gone (a restart ends "
                    "the session and the lock): taking the lock again"
                )
            self._wake.clear()
            try:
                n = await self.drain()
                if n:
                    log.debug("memory relay published %d events", n)
                backoff = 0.1
            except (InfraError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                log.warning("memory relay: %s; retrying in %.1fs", e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            ticks += 1
            if ticks % 600 == 0:
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    await self.prune()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll)
