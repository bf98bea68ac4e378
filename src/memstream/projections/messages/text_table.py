"""The text of stored messages by key: the table search reads its hits' text from.

Pure: builds statements (the store runs them).

``message_text`` holds, for every row of ``messages``, its tenancy, key, id, role, text and
time, in an ``EmbeddedRocksDB`` table keyed by one string, ``account/agent/thread/offset``
(:func:`text_key`; ids never contain ``/``: ``agents_ctx.validation.check_id``). It is filled
*by ClickHouse inside the insert into* ``messages`` (a materialized view, like the posting
lists), so the projector, replays and the bench's bulk load write it alike and the
projector sends nothing more; a table made before it is filled once at start
(:func:`backfill_sql`). A copy of a message (a redelivery or a replay) writes the same key
again: RocksDB keeps one value per key, so there is nothing to collapse.

Why (docs/transcript-search.md, "The hits' text: point reads"): a search returns ten hits,
and reading their text from ``messages`` (a MergeTree) cost 8-18 ms whatever the number of
keys -- a MergeTree read of one key took 7-8 ms here, planning and part selection included,
at any index granularity (64, 256, 1,024 rows measured). ``EmbeddedRocksDB`` answers
``key IN [...]`` with point gets (``ReadType: GetKeys``): 3.3 ms for ten keys.

Where the engine has no ``EmbeddedRocksDB`` (a ClickHouse build without RocksDB), the table
is not made and the store reads ``messages`` as before (:data:`TEXT_TABLE` absent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from memstream.projections.messages.sql import check_database, quote

TEXT_TABLE: Final = "message_text"
TEXT_VIEW: Final = "message_text_mv"
TEXT_FILLING: Final = "message_text_filling"
"""Marker table: the one-off fill of ``message_text`` from ``messages`` has not finished
(a start interrupted during it fills again; keys are overwritten, not added)."""

_KEY_SQL: Final = "concat(account_id, '/', agent_id, '/', thread_id, '/', toString(`offset`))"


def text_key(account_id: str, agent_id: str, thread_id: str, offset: int) -> str:
    """The key of a message in ``message_text`` (the view computes the same in SQL)."""
    return f"{account_id}/{agent_id}/{thread_id}/{offset}"


def text_table_ddl(database: str) -> str:
    db = check_database(database)
    return f"""CREATE TABLE IF NOT EXISTS {db}.{TEXT_TABLE} (
    key String,
    account_id String,
    agent_id String,
    thread_id String,
    `offset` UInt64,
    message_id String,
    role String,
    content String,
    created_at DateTime64(3, 'UTC')
) ENGINE = EmbeddedRocksDB
PRIMARY KEY key"""


def _select(source: str) -> str:
    return f"""SELECT {_KEY_SQL} AS key, account_id, agent_id, thread_id, `offset`, message_id,
       role, content, created_at
FROM {source}"""


def text_view_ddl(database: str) -> str:
    """The materialized view that writes the text of every insert into ``messages``."""
    db = check_database(database)
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{TEXT_VIEW} TO {db}.{TEXT_TABLE} "
        f"AS {_select(f'{db}.messages')}"
    )


def backfill_sql(database: str) -> str:
    """Fill ``message_text`` with every stored message: the one-off upgrade of a database
    made before it."""
    db = check_database(database)
    return f"INSERT INTO {db}.{TEXT_TABLE} {_select(f'{db}.messages')}"


def text_by_key_sql(database: str) -> str:
    """The text of one agent's messages at ``keys`` (:func:`text_key`): rows thread_id,
    message_id, offset, role, content, created_at (epoch ms), one per key found (params:
    account_id, agent_id, keys). Point gets; the tenancy is checked on the row too."""
    db = check_database(database)
    return f"""SELECT thread_id, message_id, `offset`, role, content,
       toUnixTimestamp64Milli(created_at) AS created_ms
FROM {db}.{TEXT_TABLE}
WHERE key IN {{keys:Array(String)}}
  AND account_id = {{account_id:String}} AND agent_id = {{agent_id:String}}"""


def text_delete_sql(database: str, keys: Sequence[str]) -> str:
    """Delete the texts at ``keys`` (point deletes: ``key IN`` literals; a mutation takes no
    parameters, so they are quoted here), synchronously."""
    if not keys:
        raise ValueError("text_delete_sql needs at least one key")
    db = check_database(database)
    listed = ", ".join(quote(k) for k in keys)
    return (
        f"ALTER TABLE {db}.{TEXT_TABLE} DELETE WHERE key IN ({listed}) SETTINGS mutations_sync = 2"
    )
