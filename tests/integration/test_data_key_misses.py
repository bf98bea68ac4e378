"""A data key that an opener did not find must not shred its records for the cache's
lifetime (issue 12: a sealed record is skipped only while its key is really gone)."""

from __future__ import annotations

import asyncpg
import pytest

from memstream.infra.data_keys import Keyring, thread_scope

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_key_missed_once_opens_its_records_once_it_is_there(
    pg_pool: asyncpg.Pool,
) -> None:
    sealer = Keyring(pg_pool, cache_s=60.0)
    opener = Keyring(pg_pool, cache_s=60.0)
    scope = thread_scope("acme", "bot", "miss-1")
    plain = b'{"type":"message.appended","data":{"content":"pangolin"}}'
    sealed = (await sealer.seal_many([(scope, plain)]))[0]
    assert sealed is not None and sealed != plain
    row = await pg_pool.fetchrow("SELECT * FROM data_keys WHERE scope = $1", scope.text)
    assert row is not None
    # the key is not there (yet) for the opener: the record reads as shredded ...
    await pg_pool.execute("DELETE FROM data_keys WHERE scope = $1", scope.text)
    assert await opener.open_many([sealed]) == [None]
    # ... and opens as soon as the key is visible, not cache_s seconds later
    await pg_pool.execute(
        "INSERT INTO data_keys (kid, scope, account_id, key) VALUES ($1, $2, $3, $4)",
        row["kid"],
        row["scope"],
        row["account_id"],
        row["key"],
    )
    assert await opener.open_many([sealed]) == [plain]
    assert await opener.open_many([sealed, plain]) == [plain, plain]
