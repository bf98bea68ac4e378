"""``memstream lag``'s relay rows: what is acknowledged but not on its topic yet.

A processor's lag counts records on a topic; a memory store acknowledged to its caller
whose outbox row the relay has not published (the relay backing off after a Postgres
restart, standby for its lock) is in no topic, so every consumer row reads 0 while recall
cannot find it. The relay rows count it (``relay:memory`` from Postgres, ``relay:journal``
from the running system's ``/readyz``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import asyncpg
import pytest

from memstream.infra.cli.ops import _relay_rows
from memstream.infra.kafka.admin import ensure_topics
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


async def test_max_lag_counts_a_relays_backlog(pg_dsn: str, kafka_bootstrap: str) -> None:
    """``memstream lag --max-lag 0`` (what a script waits on) fails while entries wait in
    the outbox, though no consumer row has any lag, and passes once they are published."""
    dsn = await _migrated(pg_dsn)
    await _outbox_rows(dsn, unpublished=2, published=0)
    prefix = f"lagrelay{uuid.uuid4().hex[:8]}."
    await ensure_topics(kafka_bootstrap, Topics(prefix), 2, 1)  # no consumer has read them
    env = {
        **os.environ,
        "MEMSTREAM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "MEMSTREAM_POSTGRES_DSN": dsn,
        "MEMSTREAM_TOPIC_PREFIX": prefix,
    }

    def lag() -> subprocess.CompletedProcess[str]:
        for _ in range(30):  # a new group's coordinator may need a moment on a fresh broker
            res = subprocess.run(
                [sys.executable, "-m", "memstream", "lag", "--json", "--max-lag", "0"],
                capture_output=True,
                check=False,
                text=True,
                timeout=120,
                env=env,
            )
            if "GroupCoordinatorNotAvailable" not in res.stderr:
                return res
            time.sleep(1.0)
        return res

    res = await asyncio.to_thread(lag)
    assert res.returncode == 1, res.stderr
    assert "lag 2 exceeds --max-lag 0" in res.stderr
    rows = json.loads(res.stdout)
    assert all(r["lag"] == 0 for r in rows if r["kind"] == "consumer"), rows
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE memory_outbox SET published_at = now()")
    finally:
        await conn.close()
    res = await asyncio.to_thread(lag)
    assert res.returncode == 0, res.stderr
