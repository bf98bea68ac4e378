"""Bounded waits on Postgres for the memory writers: a connection, a lock or a statement
that does not come within its bound raises :class:`~memstream.errors.StoreBusy` (HTTP 503
with ``Retry-After``) instead of waiting for ever.

``bounded_transaction(pool, waits)`` acquires one connection (at most ``waits.acquire_s``),
opens a transaction and sets its ``lock_timeout`` and ``statement_timeout`` (transaction
scoped: ``set_config(..., true)``, gone at commit or rollback, so the pool's connections
keep the server's defaults). A lock not granted in time (SQLSTATE 55P03), a statement
cancelled by its timeout (57014) and a pool acquire that timed out all become
``StoreBusy``; the transaction is rolled back and the connection goes back to the pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from memstream.errors import StoreBusy


@dataclass(frozen=True, slots=True)
class PgWaits:
    """How long a memory write may wait on Postgres (settings: ``postgres_*_timeout_s``)."""

    acquire_s: float = 10.0
    lock_s: float = 5.0
    statement_s: float = 30.0


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


@contextlib.asynccontextmanager
async def bounded_transaction(
    pool: asyncpg.Pool, waits: PgWaits, what: str
) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction whose waits are bounded by ``waits``; ``what`` names
    the work in the ``StoreBusy`` message ("import line 7")."""
    try:
        async with pool.acquire(timeout=waits.acquire_s) as conn, conn.transaction():
            await conn.execute(
                "SELECT set_config('lock_timeout', $1, true), "
                "set_config('statement_timeout', $2, true)",
                _ms(waits.lock_s),
                _ms(waits.statement_s),
            )
            yield conn
    except asyncpg.LockNotAvailableError:
        raise StoreBusy(
            f"{what}: a lock was not granted within {waits.lock_s:g} s (concurrent writes)"
        ) from None
    except asyncpg.QueryCanceledError:
        raise StoreBusy(f"{what}: Postgres did not answer within {waits.statement_s:g} s") from None
    except (TimeoutError, StoreBusy):  # a plain pool's timeout, or a BoundedPool's
        raise StoreBusy(
            f"{what}: no Postgres connection free within {waits.acquire_s:g} s"
        ) from None
