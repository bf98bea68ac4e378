"""The daily hygiene pass over agent memory: expiry and importance decay.

``run_hygiene(pool, clock)`` applies the pure rules of ``decay`` to every entry in Postgres:

- entries past ``expires_at`` (the one expiry, as recall and pinning read it; only an
  observation without ``expires_at`` falls back to 30 days after creation) are deleted,
  each with a ``memory.expired`` outbox event;
- ``project_fact`` and ``observation`` entries not recalled (or written) in 90 days step
  their importance down by 0.1 (floor 0.1), each with a ``memory.decayed`` event; the 90
  days restart after each step;
- ``user_profile`` entries are never decayed.

Guarantees: each batch is one transaction (changes and their events together); a second
run at the same ``now`` changes nothing (idempotent), so a pass that crashed midway can
simply be run again. The clock is injected: tests move a ``FixedClock``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import asyncpg

from memstream.agents_ctx.memory import decay
from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    NEXT_VERSION,
    append_events,
    entry_of_row,
    tombstone_of_row,
)
from memstream.clock import Clock
from memstream.schemas.limits import DECAY_FLOOR, DECAY_STEP

log = logging.getLogger(__name__)

BATCH: Final = 500


@dataclass(frozen=True, slots=True)
class HygieneReport:
    now: datetime
    expired: int
    decayed: int


async def _expire_batch(conn: asyncpg.Connection, now: datetime) -> int:
    async with conn.transaction():
        rows = await conn.fetch(
            f"""
            DELETE FROM memory_entries WHERE ctid IN (
                SELECT ctid FROM memory_entries
                WHERE (expires_at IS NOT NULL AND expires_at <= $1)
                   OR (expires_at IS NULL AND category = 'observation'
                       AND created_at + make_interval(days => $2) <= $1)
                LIMIT $3 FOR UPDATE SKIP LOCKED)
            RETURNING {ENTRY_COLUMNS}, {NEXT_VERSION} AS tomb_version
            """,
            now,
            decay.OBSERVATION_TTL.days,
            BATCH,
        )
        entries = [tombstone_of_row(r) for r in rows]
        await append_events(conn, "memory.expired", entries, now)
        return len(entries)


async def _decay_batch(conn: asyncpg.Connection, now: datetime) -> int:
    async with conn.transaction():
        rows = await conn.fetch(
            f"""
            UPDATE memory_entries SET
                importance = GREATEST($3, round((importance - $4)::numeric, 6)::float8),
                last_decayed_at = $1, version = {NEXT_VERSION}
            WHERE ctid IN (
                SELECT ctid FROM memory_entries
                WHERE category IN ('project_fact', 'observation') AND importance > $3
                  AND GREATEST(COALESCE(last_recalled_at, updated_at),
                               COALESCE(last_decayed_at, '-infinity'))
                      + make_interval(days => $2) <= $1
                  AND (expires_at IS NULL OR expires_at > $1)
                LIMIT $5 FOR UPDATE SKIP LOCKED)
            RETURNING {ENTRY_COLUMNS}
            """,
            now,
            decay.DECAY_AFTER.days,
            DECAY_FLOOR,
            DECAY_STEP,
            BATCH,
        )
        entries = [entry_of_row(r) for r in rows]
        await append_events(conn, "memory.decayed", entries, now)
        return len(entries)


async def run_hygiene(pool: asyncpg.Pool, clock: Clock) -> HygieneReport:
    """One hygiene pass at ``clock.now()``: expire first (so nothing is decayed and then
    deleted), then decay. Returns how many entries each step changed."""
    now = clock.now()
    expired = decayed = 0
    async with pool.acquire() as conn:
        while n := await _expire_batch(conn, now):
            expired += n
        while n := await _decay_batch(conn, now):
            decayed += n
    log.info("memory hygiene at %s: %d expired, %d decayed", now.isoformat(), expired, decayed)
    return HygieneReport(now=now, expired=expired, decayed=decayed)
