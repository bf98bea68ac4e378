"""Postgres adapter: the connection pool and the migration runner.

Migrations are plain numbered SQL files in ``memstream/infra/migrations`` (``0001_core.sql``,
``0002_memory.sql`` …), applied in order, each in its own transaction, recorded in
``schema_migrations``. Applying is idempotent and safe to race: an advisory lock serialises
concurrent ``migrate`` calls (``memstream migrate`` and start-up may overlap).
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any

import asyncpg
import orjson

from memstream.errors import PermanentInfraError, RetryableInfraError

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x6D656D73  # "mems"
#: how long a stopping process waits for pool connections still in use
POOL_CLOSE_GRACE_S = 10.0


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: orjson.dumps(v).decode(),
        decoder=orjson.loads,
        schema="pg_catalog",
    )


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool whose connections encode/decode ``jsonb`` as Python objects."""
    try:
        pool = await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, init=_init_connection
        )
    except (OSError, asyncpg.CannotConnectNowError) as e:
        raise RetryableInfraError(f"cannot connect to Postgres: {e}") from e
    except asyncpg.PostgresError as e:
        raise PermanentInfraError(f"Postgres refused the connection: {e}") from e
    assert pool is not None
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


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in order."""
    root = resources.files("memstream.infra") / "migrations"
    files = sorted((p for p in root.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(p.name, p.read_text(encoding="utf-8")) for p in files]


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations; returns the names applied now."""
    applied_now: list[str] = []
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
            for name, sql in migration_files():
                if name in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
                log.info("applied migration %s", name)
                applied_now.append(name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return applied_now


def record(row: asyncpg.Record | None) -> dict[str, Any] | None:
    return dict(row) if row is not None else None
