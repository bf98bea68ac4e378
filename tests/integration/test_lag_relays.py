"""``memstream lag``'s relay rows: what is acknowledged but not on its topic yet.

A processor's lag counts records on a topic; a memory store acknowledged to its caller
whose outbox row the relay has not published (the relay backing off after a Postgres
restart, standby for its lock) is in no topic, so every consumer row reads 0 while recall
cannot find it. The relay rows count it (``relay:memory`` from Postgres, ``relay:journal``
from the running system's ``/readyz``).
"""

from __future__ import annotations

import asyncpg
import pytest

from memstream.infra.cli.ops import _relay_rows
from memstream.infra.postgres import create_pool, migrate
from memstream.schemas.topics import Topics
from tests.fixtures.stores import fresh_database

TOPICS = Topics("memstream.")


async def _migrated(pg_dsn: str) -> str:
    dsn = await fresh_database(pg_dsn)
    pool = await create_pool(dsn)
    try:
        await migrate(pool)
    finally:
        await pool.close()
    return dsn


async def _outbox_rows(dsn: str, *, unpublished: int, published: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for i in range(unpublished + published):
            await conn.execute(
                "INSERT INTO memory_outbox (account_id, agent_id, event_id, event, published_at) "
                "VALUES ('acme', 'bot', $1, $2, CASE WHEN $3 THEN now() END)",
                f"e{i}",
                b"{}",
                i >= unpublished,
            )
    finally:
        await conn.close()


async def test_unpublished_outbox_rows_are_the_memory_relays_lag(pg_dsn: str) -> None:
    dsn = await _migrated(pg_dsn)
    assert await _relay_rows({}, dsn, TOPICS) == [
        {
            "kind": "relay",
            "group": "relay:memory",
            "topic": "memstream.memory",
            "partition": None,
            "committed": None,
            "end_offset": None,
            "lag": 0,
            "since_commit_s": None,
            "gap": 0,
            "state": None,
        }
    ]
    await _outbox_rows(dsn, unpublished=3, published=2)
    (row,) = await _relay_rows({}, dsn, TOPICS)
    assert row["lag"] == 3  # the published ones are on the topic: counted by consumer lag


async def test_the_journal_relays_backlog_and_states_come_from_the_running_system(
    pg_dsn: str,
) -> None:
    dsn = await _migrated(pg_dsn)
    report: dict[str, object] = {
        "relays": {"journal": 7},
        "loops": {
            "journal-relay": {"state": "running"},
            "outbox-relay": {"state": "waiting", "waiting_for": "postgres"},
        },
    }
    rows = {r["group"]: r for r in await _relay_rows(report, dsn, TOPICS)}
    assert rows["relay:journal"]["lag"] == 7
    assert rows["relay:journal"]["topic"] == "memstream.journal"
    assert rows["relay:journal"]["state"] == "running"
    assert rows["relay:memory"]["state"] == "waiting for postgres"


async def test_an_unknown_backlog_is_left_out_not_read_as_zero(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # no running system (no report), a database memstream never migrated, Postgres down
    bare = await fresh_database(pg_dsn)
    assert await _relay_rows({}, bare, TOPICS) == []
    down = "postgresql://memstream@127.0.0.1:9/memstream"
    assert await _relay_rows({"relays": {"journal": "x"}}, down, TOPICS) == []
    assert "memory relay backlog unknown" in capsys.readouterr().err
