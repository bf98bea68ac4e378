"""Entry rows and the transactional outbox, the SQL shared by the memory writers.

Every change to ``memory_entries`` appends its ``memory.*`` event to ``memory_outbox`` in the
same transaction (:func:`append_events`), and wakes the relay with ``NOTIFY`` (delivered only
on commit). So an entry change and its event are written together or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Final, cast

import asyncpg

from memstream.agents_ctx.memory.policy import Usage
from memstream.clock import epoch_ms
from memstream.schemas.events import MemoryEventType, encode, memory_event
from memstream.schemas.records import Category, MemoryEntry, Visibility

OUTBOX_CHANNEL: Final = "memstream_memory_outbox"
"""The LISTEN/NOTIFY channel the relay wakes on."""

ENTRY_COLUMNS: Final = (
    "account_id, agent_id, owner, key, content, category, visibility, importance, user_id, "
    "content_hash, expires_at, created_at, updated_at, recall_count, last_recalled_at, version"
)

NEXT_VERSION: Final = "nextval('memory_version_seq')"


async def unpublished_count(db: asyncpg.Pool | asyncpg.Connection) -> int:
    """Outbox rows the relay has not published yet (its backlog: ``memstream lag``'s
    ``relay:memory``, the console, ``memstream_relay_backlog{relay="memory"}``)."""
    n = await db.fetchval("SELECT count(*) FROM memory_outbox WHERE published_at IS NULL")
    return int(n)


def entry_of_row(row: Mapping[str, object]) -> MemoryEntry:
    """A ``memory_entries`` row as a record."""
    return MemoryEntry(
        account_id=cast(str, row["account_id"]),
        agent_id=cast(str, row["agent_id"]),
        key=cast(str, row["key"]),
        content=cast(str, row["content"]),
        category=cast(Category, row["category"]),
        visibility=cast(Visibility, row["visibility"]),
        importance=cast(float, row["importance"]),
        content_hash=cast(str, row["content_hash"]),
        created_at=cast(datetime, row["created_at"]),
        updated_at=cast(datetime, row["updated_at"]),
        user_id=cast("str | None", row["user_id"]),
        expires_at=cast("datetime | None", row["expires_at"]),
        recall_count=cast(int, row["recall_count"]),
        last_recalled_at=cast("datetime | None", row["last_recalled_at"]),
        version=cast(int, row["version"]),
    )


def tombstone_of_row(row: Mapping[str, object]) -> MemoryEntry:
    """A deleted row (``RETURNING {ENTRY_COLUMNS}, {NEXT_VERSION} AS tomb_version``) as the
    entry its delete event carries: the last state, with a fresh version."""
    return entry_of_row(row).with_changes(version=cast(int, row["tomb_version"]))


async def append_events(
    conn: asyncpg.Connection,
    typ: MemoryEventType,
    entries: Iterable[MemoryEntry],
    now: datetime,
) -> int:
    """Append one ``typ`` event per entry to the outbox and notify the relay.

    Must run inside the transaction that made the change. Event ids are deterministic per
    (entry identity, version, type) — see ``schemas.events.memory_event`` — so a consumer
    can dedupe a re-published event.
    """
    return await append_typed_events(conn, [(typ, e) for e in entries], now)


async def append_typed_events(
    conn: asyncpg.Connection,
    events: Sequence[tuple[MemoryEventType, MemoryEntry]],
    now: datetime,
) -> int:
    """:func:`append_events` for events of several types, in the order given (one round
    trip, whatever their number)."""
    ts = epoch_ms(now)
    envs = [memory_event(typ, e, ts) for typ, e in events]
    if not envs:
        return 0
    # one round trip: the rows, and the NOTIFY (from a one-row subquery, run once)
    await conn.execute(
        "INSERT INTO memory_outbox (account_id, agent_id, event_id, event) "
        "SELECT a, g, i, e FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) "
        "WITH ORDINALITY AS u(a, g, i, e, n), (SELECT pg_notify($5, '')) AS wake ORDER BY n",
        [env.account_id for env in envs],
        [env.agent_id for env in envs],
        [env.id for env in envs],
        [encode(env) for env in envs],
        OUTBOX_CHANNEL,
    )
    return len(envs)


async def capacity_usage(
    conn: asyncpg.Connection, entry: MemoryEntry, now: datetime, *, without_itself: bool
) -> Usage:
    """Take the (account, agent, category) capacity lock, then count the live entries of
    ``entry``'s category (the agent's, and ``entry.user_id``'s), in one round trip (the SQL function
    ``memstream_capacity_usage``); with ``without_itself``, a row at ``entry``'s identity
    (one this transaction has just written) is not counted.

    The lock is held until the transaction ends, so counts cannot be raced past a limit:
    a count sees every entry committed before it. Every memory writer takes this lock as
    the **last** lock of its transaction, after its own row writes, then commits: the
    serialised part of a write is only the count and the commit, and a lock holder never
    waits for a row lock (no deadlock between writers)."""
    row = await conn.fetchrow(
        "SELECT agent_count, user_count FROM memstream_capacity_usage"
        "($1, $2, $3, $4, $5, $6, $7, $8)",
        entry.account_id,
        entry.agent_id,
        entry.category,
        entry.user_id,
        now,
        without_itself,
        entry.owner,
        entry.key,
    )
    assert row is not None
    return Usage(agent=int(row["agent_count"]), user=int(row["user_count"]))


UPSERT_SET: Final = """\
    content = EXCLUDED.content, category = EXCLUDED.category,
    visibility = EXCLUDED.visibility, importance = EXCLUDED.importance,
    user_id = EXCLUDED.user_id, content_hash = EXCLUDED.content_hash,
    expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at,
    updated_at = EXCLUDED.updated_at, recall_count = EXCLUDED.recall_count,
    last_recalled_at = EXCLUDED.last_recalled_at, last_decayed_at = NULL,"""
"""What an upsert of an entry over its identity sets, but the version (each writer's own)."""

_UPSERT: Final = f"""
INSERT INTO memory_entries ({ENTRY_COLUMNS})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, {NEXT_VERSION})
ON CONFLICT (account_id, agent_id, owner, key) DO UPDATE SET
{UPSERT_SET}
    version = EXCLUDED.version
"""


def _row_args(e: MemoryEntry) -> tuple[object, ...]:
    return (
        e.account_id,
        e.agent_id,
        e.owner,
        e.key,
        e.content,
        e.category,
        e.visibility,
        e.importance,
        e.user_id,
        e.content_hash,
        e.expires_at,
        e.created_at,
        e.updated_at,
        e.recall_count,
        e.last_recalled_at,
    )


async def write_entry_if(
    conn: asyncpg.Connection, e: MemoryEntry, found_version: int | None
) -> MemoryEntry | None:
    """Write ``e`` at its identity, with a fresh version, only if the identity is still as
    read: no row (``found_version`` None) or the row at ``found_version``. Returns the row
    as written, or None (nothing written) if another transaction got there first."""
    row = await conn.fetchrow(
        f"{_UPSERT} WHERE memory_entries.version = $16 RETURNING {ENTRY_COLUMNS}",
        *_row_args(e),
        found_version,
    )
    return None if row is None else entry_of_row(row)
