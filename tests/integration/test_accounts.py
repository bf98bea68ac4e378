"""Accounts, API keys, agents and threads against a real embedded Postgres."""

from __future__ import annotations

import asyncio

import asyncpg

from memstream.infra.accounts import Accounts
from memstream.infra.postgres import create_pool, migrate, migration_files, statements
from memstream.schemas.records import ThreadRef
from tests.fixtures.stores import fresh_database


async def test_migrate_is_idempotent(pg_pool: asyncpg.Pool) -> None:
    assert await migrate(pg_pool) == []
    names = [r["name"] for r in await pg_pool.fetch("SELECT name FROM schema_migrations")]
    assert "0001_core.sql" in names


async def test_an_index_build_cut_short_is_built_again_without_a_transaction(
    pg_pool: asyncpg.Pool,
) -> None:
    """0014 builds its index CONCURRENTLY (outside a transaction, as Postgres requires); a
    build cut short leaves an invalid index and no record, and the next migrate rebuilds it."""
    name = "0014_threads_deleted.sql"
    valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'threads_deleted'::regclass"
    assert await pg_pool.fetchval(valid) is True
    await pg_pool.execute("DELETE FROM schema_migrations WHERE name = $1", name)
    await pg_pool.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'threads_deleted'::regclass"
    )
    assert await migrate(pg_pool) == [name]
    assert await pg_pool.fetchval(valid) is True
    assert await migrate(pg_pool) == []


async def test_concurrent_migrations_of_a_fresh_database_all_succeed(pg_dsn: str) -> None:
    """``memstream migrate`` and start-ups may overlap. A waiter blocked in
    ``pg_advisory_lock`` deadlocked with 0014's ``CREATE INDEX CONCURRENTLY`` (it waits for
    every running statement's snapshot): two of three failed. Each file is applied once."""
    dsn = await fresh_database(pg_dsn)
    pools = [await create_pool(dsn) for _ in range(3)]
    try:
        async with asyncio.timeout(120):
            applied = await asyncio.gather(*(migrate(p) for p in pools))
        names = sorted(n for a in applied for n in a)
        assert names == sorted(n for n, _ in migration_files())  # each once, none failed
    finally:
        for p in pools:
            await p.close()


def test_a_no_transaction_migration_is_split_into_its_statements() -> None:
    sql = "-- memstream: no-transaction\n-- why\nDROP INDEX x;\nCREATE INDEX y\n  ON t (a);\n"
    assert statements(sql) == [
        "-- memstream: no-transaction\n-- why\nDROP INDEX x;",
        "CREATE INDEX y\n  ON t (a);",
    ]
    assert statements("-- only a comment;\n") == []


async def test_keys_are_hashed_and_authenticate(pg_pool: asyncpg.Pool) -> None:
    accounts = Accounts(pg_pool)
    key = await accounts.create_key("acme")
    assert key.startswith("msk_")
    assert await accounts.authenticate(key) == "acme"
    assert await accounts.authenticate(key + "x") is None
    stored = await pg_pool.fetch("SELECT key_hash FROM api_keys")
    assert all(key not in r["key_hash"] for r in stored)


async def test_seeded_key_is_idempotent_and_owned(pg_pool: asyncpg.Pool) -> None:
    accounts = Accounts(pg_pool)
    await accounts.add_key("seeded", "secret-1")
    await accounts.add_key("seeded", "secret-1")
    assert await accounts.authenticate("secret-1") == "seeded"
    try:
        await accounts.add_key("other", "secret-1")
    except ValueError as e:
        assert "another account" in str(e)
    else:
        raise AssertionError("a key must not move between accounts")


async def test_agents_and_threads(pg_pool: asyncpg.Pool) -> None:
    accounts = Accounts(pg_pool)
    await accounts.ensure_account("a1")
    agent = await accounts.ensure_agent("a1", "bot")
    assert agent.memory is False
    assert (await accounts.configure_agent("a1", "bot", memory=True)).memory is True
    assert (await accounts.ensure_agent("a1", "bot")).memory is True  # implicit use keeps config

    ref = ThreadRef("a1", "bot", "t1")
    thread, created = await accounts.create_thread(
        ref, {"config": {"max_working_memory_messages": 5}}
    )
    assert thread is not None
    assert created and thread.config.window() == 5
    again, created = await accounts.create_thread(ref, {})
    assert again is not None
    assert not created and again.config.window() == 5
    assert await accounts.delete_thread(ref)
    assert not await accounts.delete_thread(ref)
    got = await accounts.get_thread(ref)
    assert got is not None and got.deleted


async def test_key_cache_is_short_lived(pg_pool: asyncpg.Pool) -> None:
    accounts = Accounts(pg_pool, key_cache_ttl_s=0.2)
    key = await accounts.create_key("revocable")
    assert await accounts.authenticate(key) == "revocable"
    await pg_pool.execute("UPDATE api_keys SET revoked_at = now() WHERE account_id = 'revocable'")
    assert await accounts.authenticate(key) == "revocable"  # still cached
    await asyncio.sleep(0.25)
    assert await accounts.authenticate(key) is None  # revocation visible after the TTL
