"""Postgres adapter: the connection pool, the migration runner, and the vacuum erasures run.

Migrations are plain numbered SQL files in ``memstream/infra/migrations`` (``0001_core.sql``,
``0002_memory.sql`` …), applied in order, each in its own transaction, recorded in
``schema_migrations``. Applying is idempotent and safe to race: an advisory lock, polled,
serialises concurrent ``migrate`` calls (``memstream migrate`` and start-up may overlap). A
file whose first line is ``-- memstream: no-transaction`` runs its statements one by one
outside a transaction (what ``CREATE INDEX CONCURRENTLY`` needs, so an upgrade builds an index without
blocking writes to its table); such a file must be safe to run again from the start, since
it is recorded only once all of it has run.

**Returning a connection to the pool.** asyncpg resets every connection it takes back with
one more statement (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``): a
second round trip for every pooled query, measured at half the rate of a point read (3.4k
against 6.7k a second at concurrency 1; ~180 against ~100 µs of CPU each). Our statements
keep no session state, except the few that take a session's advisory lock, ``LISTEN`` or
``SET`` something; those call :func:`keeps_session_state` on their connection, and only such
a connection is reset that way (:class:`PooledConnection`). An open transaction is rolled
back on release either way, as asyncpg does; ``tests/unit/test_pg_session_state_scan.py``
finds any statement of ``src`` that keeps session state without the call.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any

import asyncpg
import orjson

from memstream.errors import PermanentInfraError, RetryableInfraError, StoreBusy

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x6D656D73  # "mems"
#: how long a stopping process waits for pool connections still in use
POOL_CLOSE_GRACE_S = 10.0
#: how long ``pool.acquire()`` waits for a free connection by default (settings:
#: ``postgres_acquire_timeout_s``)
ACQUIRE_TIMEOUT_S = 10.0


class PooledConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no types
    """A pool's connection, released without asyncpg's reset statement unless
    :func:`keeps_session_state` marked it (module docstring); listeners are removed and an
    open transaction rolled back on every release, as before."""

    _keeps_session_state = False

    def get_reset_query(self) -> str:
        if self._keeps_session_state:
            return str(super().get_reset_query())
        return ""

    async def reset(self, *, timeout: float | None = None) -> None:
        await super().reset(timeout=timeout)
        self._keeps_session_state = False

    async def add_listener(self, channel: str, callback: Any) -> None:
        self._keeps_session_state = True  # LISTEN lasts as long as the session
        await super().add_listener(channel, callback)


def keeps_session_state(conn: asyncpg.Connection) -> None:
    """Mark ``conn`` as holding session state (an advisory lock, a ``SET``, a ``LISTEN``):
    the pool then resets it fully when it is released, whatever the code meant to undo.
    Call it before the statement."""
    target = getattr(conn, "_con", conn)  # what ``pool.acquire()`` gives is a proxy of it
    if isinstance(target, PooledConnection):
        target._keeps_session_state = True  # noqa: SLF001 - the class's own flag


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: orjson.dumps(v).decode(),
        decoder=orjson.loads,
        schema="pg_catalog",
    )


class BoundedPool(asyncpg.Pool):  # type: ignore[misc]  # asyncpg ships no types
    """An asyncpg pool whose ``acquire()`` waits at most ``acquire_timeout_s`` for a free
    connection unless told otherwise, and then raises :class:`StoreBusy` (a route
    answers 503 with ``Retry-After``; a processor pauses and retries). asyncpg's own default
    is to wait for ever: one task holding every connection used to hang every route."""

    acquire_timeout_s: float = ACQUIRE_TIMEOUT_S

    def acquire(self, *, timeout: float | None = None) -> Any:
        return _BoundedAcquire(
            super().acquire(timeout=self.acquire_timeout_s if timeout is None else timeout),
            self.acquire_timeout_s if timeout is None else timeout,
        )


class _BoundedAcquire:
    """``async with pool.acquire()`` (and ``await pool.acquire()``) with the timeout named."""

    def __init__(self, inner: Any, timeout_s: float) -> None:
        self._inner = inner
        self._timeout_s = timeout_s

    def _busy(self) -> StoreBusy:
        return StoreBusy(
            f"no Postgres connection came free within {self._timeout_s:g} s (the pool is busy)"
        )

    async def __aenter__(self) -> asyncpg.Connection:
        try:
            return await self._inner.__aenter__()
        except TimeoutError as e:
            raise self._busy() from e

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.__aexit__(*exc)

    def __await__(self) -> Any:
        return self._await().__await__()

    async def _await(self) -> asyncpg.Connection:
        try:
            return await self._inner
        except TimeoutError as e:
            raise self._busy() from e


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    acquire_timeout_s: float = ACQUIRE_TIMEOUT_S,
) -> asyncpg.Pool:
    """A :class:`BoundedPool` whose connections encode/decode ``jsonb`` as Python objects."""
    pool = BoundedPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        max_queries=50000,
        max_inactive_connection_lifetime=300.0,
        init=_init_connection,
        loop=None,
        connection_class=PooledConnection,
        record_class=asyncpg.Record,
    )
    pool.acquire_timeout_s = acquire_timeout_s
    try:
        await pool
    except (OSError, asyncpg.CannotConnectNowError) as e:
        raise RetryableInfraError(f"cannot connect to Postgres: {e}") from e
    except asyncpg.PostgresError as e:
        raise PermanentInfraError(f"Postgres refused the connection: {e}") from e
    return pool


async def close_pool(pool: asyncpg.Pool, grace_s: float = POOL_CLOSE_GRACE_S) -> None:
    """Close ``pool``, waiting at most ``grace_s`` for connections still in use to come
    back; then terminate them. (``Pool.close`` alone waits for ever for a connection some
    task still holds: a process then ignores SIGTERM.)"""
    try:
        await asyncio.wait_for(pool.close(), grace_s)
    except TimeoutError:
        log.warning("Postgres connections still in use after %.0f s; terminating them", grace_s)
        pool.terminate()


NO_TRANSACTION = "-- memstream: no-transaction"


def statements(sql: str) -> list[str]:
    """A no-transaction migration's statements: each ends with ``;`` at the end of a line
    (its files hold plain statements, no function bodies). Comments are kept. Pure."""
    out: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        current.append(line)
        if line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
            out.append("\n".join(current).strip())
            current = []
    rest = "\n".join(current).strip()
    if rest and any(not ln.lstrip().startswith("--") for ln in rest.splitlines() if ln.strip()):
        out.append(rest)
    return out


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in order."""
    root = resources.files("memstream.infra") / "migrations"
    files = sorted((p for p in root.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(p.name, p.read_text(encoding="utf-8")) for p in files]


MIGRATION_LOCK_POLL_S = 0.05


async def _take_migration_lock(conn: Any) -> None:
    """The migration lock, polled (``pg_try_advisory_lock``) rather than waited for: a
    session blocked in ``pg_advisory_lock`` is a running statement with a snapshot, which
    ``CREATE INDEX CONCURRENTLY`` in the lock holder's session waits for, while it waits for
    the lock: a deadlock Postgres breaks by failing one of them (measured: two of three
    concurrent migrations of a fresh database failed so). Polling holds no snapshot
    between tries."""
    while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _MIGRATION_LOCK):
        await asyncio.sleep(MIGRATION_LOCK_POLL_S)


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations; returns the names applied now."""
    applied_now: list[str] = []
    async with pool.acquire() as conn:
        keeps_session_state(conn)
        await _take_migration_lock(conn)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
            for name, sql in migration_files():
                if name in done:
                    continue
                record = "INSERT INTO schema_migrations (name) VALUES ($1)"
                if sql.startswith(NO_TRANSACTION):  # recorded once every statement ran
                    for statement in statements(sql):
                        await conn.execute(statement)
                    await conn.execute(record, name)
                else:
                    async with conn.transaction():
                        await conn.execute(sql)
                        await conn.execute(record, name)
                log.info("applied migration %s", name)
                applied_now.append(name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return applied_now


REWRITE_LOCK_TIMEOUT_S = 5.0
"""How long :func:`vacuum` waits for a table's lock before it falls back to a plain vacuum
(a session holding the table would otherwise queue every other user behind the rewrite)."""


async def vacuum(pool: asyncpg.Pool, *tables: str, rewrite: bool) -> bool:
    """Vacuum ``tables`` (trusted names) after an erasure's deletes: the dead rows go, but a
    plain ``VACUUM`` may leave their bytes in a page's free space until the page is reused
    (measured: deleted memory entries and data keys still read from the data files).
    ``rewrite``: ``VACUUM FULL``, a new file without them (each table locked while it is
    rewritten, ~1.8 s per 1M narrow rows), falling back to a plain vacuum, with a warning,
    when a table's lock is not had within :data:`REWRITE_LOCK_TIMEOUT_S`. Returns whether
    every table was rewritten."""
    if not rewrite:
        await pool.execute(f"VACUUM {', '.join(tables)}")
        return False
    rewritten = True
    async with pool.acquire() as conn:
        keeps_session_state(conn)
        await conn.execute(f"SET lock_timeout = '{int(REWRITE_LOCK_TIMEOUT_S * 1000)}ms'")
        try:
            for table in tables:
                try:
                    await conn.execute(f"VACUUM FULL {table}")
                except asyncpg.LockNotAvailableError:
                    log.warning(
                        "%s: its lock was not had within %.0f s; vacuumed without a rewrite, "
                        "so the erased rows' bytes may stay in its files until reused",
                        table,
                        REWRITE_LOCK_TIMEOUT_S,
                    )
                    await conn.execute(f"VACUUM {table}")
                    rewritten = False
        finally:
            await conn.execute("RESET lock_timeout")
    return rewritten


def record(row: asyncpg.Record | None) -> dict[str, Any] | None:
    return dict(row) if row is not None else None
