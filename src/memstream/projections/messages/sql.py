"""Every SQL statement of the message projection, in one place for both ClickHouse adapters.

Pure: builds statements and their parameters, and mirrors the table's tokenizer for query
words. Parameters use ClickHouse's ``{name:Type}`` syntax, which both chdb and a ClickHouse
server (through clickhouse-connect) bind; the adapters differ only in how they pass them.

Tables (database configurable, ``memstream`` by default):

- ``messages``: user and assistant text, ``ReplacingMergeTree(seq)`` ordered by
  ``(account_id, agent_id, thread_id, offset)`` (ARCHITECTURE.md) and partitioned by *year*
  of ``created_at`` (not month: every search pays a fixed text-index and primary-key cost per
  part, and monthly partitions multiplied the parts; see docs/transcript-search.md), with
  ``account_id``/``agent_id`` as ``LowCardinality`` (the tenancy filter compares
  dictionary codes), and a ``text`` index on ``content`` (``splitByNonAlpha`` tokens,
  ``lowerUTF8`` preprocessor). A replayed message has the same key, partition and content as
  the first copy, so duplicates collapse on merge and the search query dedupes before merge.
- ``message_vectors``: one dense vector per message (the dense side of search, written by
  :mod:`memstream.projections.messages.vectors` behind the projector), ``ReplacingMergeTree``
  on the message key plus the embedding ``model``; a vector is derived from its message's
  text, so it is erased with the thread.
- ``thread_users``: the set of users who wrote in each thread, ``ReplacingMergeTree`` on
  ``(account_id, agent_id, thread_id, user_id)``. It decides privacy (see :func:`visible_threads_filter`).

Matching and ranking (docs/transcript-search.md): the ``terms`` column holds each message's
analysed terms (:mod:`memstream.projections.analyzer`, computed by ClickHouse at insert);
their posting lists (``message_terms``) and the ranked search's SQL are in
:mod:`memstream.projections.messages.postings`, its rules in
:mod:`memstream.projections.messages.ranking`. A message matches when it shares *any* query
term, and is scored by BM25 (k1 :data:`BM25_K1`, b :data:`BM25_B`) over the caller's agent,
plus a proximity bonus when consecutive query terms appear close together and in order;
ties go to the newest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from memstream.errors import InvalidRequest
from memstream.projections.analyzer import query_terms, terms_sql
from memstream.schemas.events import EVENT_TYPES as _EVENT_TYPES

SqlParam: TypeAlias = str | int | Sequence[str] | Sequence[int] | Sequence[float]
"""A bound parameter: String, UInt, Array(String), Array(UInt64) or Array(Float32)."""

DEFAULT_DATABASE: Final = "memstream"
MESSAGES_GRANULARITY: Final = 1_024
"""Rows per granule of ``messages``. A hit reads its whole granule of ``content``; 1,024
rows (vs ClickHouse's 8,192) cuts that read amplification 8x for selective searches, at the
cost of a primary index 8x larger (still ~1k marks per million rows)."""
SEARCH_SETTINGS: Final = (
    "use_text_index_dictionary_cache = 1, use_text_index_postings_cache = 1, "
    "use_index_for_in_with_subqueries = 0"
)
"""Keep text-index dictionaries and posting lists in memory between searches (both caches
are off by default; newer ClickHouse ignores the first). Do not analyse the primary key with
the private-thread set: a ``NOT IN`` set never narrows the read, and the analysis cost
~2 ms per search (identical results)."""
BM25_K1: Final = 1.2
BM25_B: Final = 0.75
"""BM25's term-frequency saturation and length normalisation (the usual defaults)."""
PROXIMITY_WINDOW: Final = 3
"""Consecutive query terms count as "together" when the second follows the first within
this many positions in the message."""
PROXIMITY_BOOST: Final = 0.5
"""relevance = bm25 x (1 + PROXIMITY_BOOST x fraction of consecutive query-term pairs found
together): an exact or near phrase lifts a message by up to half its BM25 score."""
RERANK_WINDOW: Final = 100
"""The proximity bonus is computed for the best RERANK_WINDOW messages by BM25 only."""
MAX_QUERY_WORDS: Final = 32
"""More words than this cannot make a query more selective; reject rather than scan."""

_IDENT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_database(name: str) -> str:
    if not _IDENT.match(name):
        raise InvalidRequest(f"bad ClickHouse database name {name!r}", field="clickhouse_database")
    return name


def ddl(database: str) -> list[str]:
    """Idempotent statements creating the database and both tables."""
    db = check_database(database)
    return [
        f"CREATE DATABASE IF NOT EXISTS {db}",
        f"""CREATE TABLE IF NOT EXISTS {db}.messages (
    account_id LowCardinality(String),
    agent_id LowCardinality(String),
    thread_id String,
    `offset` UInt64,
    message_id String,
    role LowCardinality(String),
    content String,
    user_id String,
    tool_call_ids Array(String),
    created_at DateTime64(3, 'UTC'),
    seq UInt64,
    terms Array(String) MATERIALIZED {terms_sql("content")},
    INDEX terms_index terms TYPE text(tokenizer = array)
) ENGINE = ReplacingMergeTree(seq)
PARTITION BY toYear(created_at)
ORDER BY (account_id, agent_id, thread_id, `offset`)
SETTINGS index_granularity = {MESSAGES_GRANULARITY}""",
        f"""CREATE TABLE IF NOT EXISTS {db}.message_vectors (
    account_id LowCardinality(String),
    agent_id LowCardinality(String),
    thread_id String,
    `offset` UInt64,
    model LowCardinality(String),
    vec Array(Float32)
) ENGINE = ReplacingMergeTree
ORDER BY (account_id, agent_id, thread_id, `offset`, model)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.thread_users (
    account_id String,
    agent_id String,
    thread_id String,
    user_id String
) ENGINE = ReplacingMergeTree
ORDER BY (account_id, agent_id, thread_id, user_id)""",
    ]


def upgrade_ddl(database: str) -> list[str]:
    """Statements that bring a ``messages`` table made before ranked search (no ``terms``
    column) to the current layout: the column and its index are added and computed for the
    rows already there (a one-off mutation), the old word index is dropped. Run only when
    the column is missing (:func:`has_terms_sql`)."""
    db = check_database(database)
    return [
        f"ALTER TABLE {db}.messages ADD COLUMN IF NOT EXISTS terms Array(String) "
        f"MATERIALIZED {terms_sql('content')}",
        f"ALTER TABLE {db}.messages MATERIALIZE COLUMN terms SETTINGS mutations_sync = 1",
        f"ALTER TABLE {db}.messages ADD INDEX IF NOT EXISTS terms_index terms "
        "TYPE text(tokenizer = array)",
        f"ALTER TABLE {db}.messages MATERIALIZE INDEX terms_index SETTINGS mutations_sync = 1",
        f"ALTER TABLE {db}.messages DROP INDEX IF EXISTS content_tokens",
    ]


def has_terms_sql(database: str) -> str:
    """One row with 1 when ``messages`` has its ``terms`` column, 0 otherwise (parameter
    ``database``)."""
    check_database(database)
    return (
        "SELECT count() FROM system.columns WHERE database = {database:String} "
        "AND table = 'messages' AND name = 'terms'"
    )


def query_words(query: str) -> tuple[str, ...]:
    """The query's terms as the ``terms`` column holds text (:func:`.analyzer.query_terms`:
    stemmed, stop words dropped unless nothing else is left, duplicates dropped)."""
    return query_terms(query)


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """A validated search: who asks, which words, where, how many."""

    account_id: str
    agent_id: str
    user_id: str | None
    words: tuple[str, ...]
    limit: int
    thread_id: str | None = None
    explain: bool = False
    text: str = ""
    """The query as asked (for the dense side's query vector); empty: lexical only."""
    excluded_threads: tuple[str, ...] = ()
    """Ids of threads never searched, whoever asks: the agent's deleted threads, as Postgres
    (their authority) says (``journal_message_search`` reads them). Kept out inside every
    query (:func:`visible_threads_filter`, the lexical and vector indexes' filters), so a
    search still returns ``limit`` hits when that many others match."""
    every_user: bool = False
    """An operator's search (the console): every user's threads, no privacy filter (deleted
    threads are still left out). Never set from an agent surface."""


def visible_threads_filter(db: str, one_thread: bool, excluded: bool = False) -> str:
    # A thread is private when any of its messages carries a user: it is then visible only
    # to those users. Threads whose messages carry no user are visible to every caller of
    # the agent. A caller without a user ('' here) sees only threads nobody owns.
    # Scoped to one thread, only that thread's owners are read. ``excluded``: the threads
    # at {excluded_threads:Array(String)} (deleted ones) are left out too.
    scope = "AND thread_id = {thread_id:String}" if one_thread else ""
    out = f"""thread_id NOT IN (
        SELECT thread_id FROM {db}.thread_users
        WHERE account_id = {{account_id:String}} AND agent_id = {{agent_id:String}} {scope}
        GROUP BY thread_id
        HAVING NOT has(groupArray(user_id), {{user_id:String}}))"""
    if excluded:
        out += "\n  AND NOT has({excluded_threads:Array(String)}, thread_id)"
    return out


def spec_filter(db: str, spec: SearchSpec) -> str:
    """:func:`visible_threads_filter` for ``spec`` (bind :func:`spec_filter_params`); for an
    operator's search (``every_user``) the deleted threads' filter alone."""
    if spec.every_user:
        return (
            "NOT has({excluded_threads:Array(String)}, thread_id)" if spec.excluded_threads else "1"
        )
    return visible_threads_filter(db, spec.thread_id is not None, bool(spec.excluded_threads))


def spec_filter_params(spec: SearchSpec) -> dict[str, SqlParam]:
    """The parameters :func:`spec_filter` binds besides the tenant's."""
    params: dict[str, SqlParam] = {"user_id": spec.user_id or ""}
    if spec.thread_id is not None:
        params["thread_id"] = spec.thread_id
    if spec.excluded_threads:
        params["excluded_threads"] = list(spec.excluded_threads)
    return params


def collection_stats_sql(database: str) -> str:
    """One row: how many messages the agent has and their average length in terms (reads
    only the account/agent columns and the array sizes of ``terms``)."""
    db = check_database(database)
    return f"""SELECT count(), avg(length(terms)) FROM {db}.messages
WHERE account_id = {{account_id:String}} AND agent_id = {{agent_id:String}}
SETTINGS optimize_functions_to_subcolumns = 1"""


DENSE_WINDOW: Final = 50
"""With a dense side, each of the two lists (BM25, dense) brings its best DENSE_WINDOW
messages to the fusion (:mod:`memstream.projections.messages.fusion`)."""


def dense_sql(
    database: str,
    spec: SearchSpec,
    vector: Sequence[float],
    model: str,
    k: int,
    keys: Sequence[tuple[str, int]] = (),
) -> tuple[str, dict[str, SqlParam]]:
    """The dense side: the ``k`` visible messages whose vector (of ``model``) is most similar
    (cosine) to the query's, with the same tenant, thread-scope and privacy filters as
    :func:`~.postings.score_sql`, inside the query, plus the similarity of the messages at ``keys``
    (BM25's candidates) that have a vector, in the same scan. Rows: thread_id, offset,
    similarity. One row per (thread, offset) even before merges (a replayed vector is
    identical)."""
    db = check_database(database)
    thread_filter = "AND thread_id = {thread_id:String}" if spec.thread_id is not None else ""
    sql = f"""SELECT thread_id, `offset`, 1 - cosineDistance(vec, {{vector:Array(Float32)}}) AS sim
FROM {db}.message_vectors
WHERE account_id = {{account_id:String}} AND agent_id = {{agent_id:String}}
  {thread_filter}
  AND model = {{model:String}}
  AND {spec_filter(db, spec)}
ORDER BY has(arrayZip({{key_threads:Array(String)}}, {{key_offsets:Array(UInt64)}}),
              (thread_id, `offset`)) DESC,
         sim DESC, thread_id, `offset`
LIMIT 1 BY thread_id, `offset`
LIMIT {{k:UInt32}}
SETTINGS {SEARCH_SETTINGS}"""
    params: dict[str, SqlParam] = {
        "account_id": spec.account_id,
        "agent_id": spec.agent_id,
        **spec_filter_params(spec),
        "vector": [float(x) for x in vector],
        "model": model,
        "k": k + len(keys),
        "key_threads": [t for t, _ in keys],
        "key_offsets": [o for _, o in keys],
    }
    return sql, params


def messages_by_key_sql(database: str, *, terms: bool = True) -> str:
    """The stored messages of one agent at the keys ``(thread_ids[i], offsets[i])``: rows
    thread_id, message_id, offset, role, content, created_at (epoch ms), then (``terms``)
    terms; one per key. For the text of the hits returned, and the dense side's hits that
    BM25 did not return (params: account_id, agent_id, thread_ids, offsets). The keys are
    a set of (thread, offset) tuples, which the primary key narrows to their granules."""
    db = check_database(database)
    return f"""SELECT thread_id, message_id, `offset`, role, content,
       toUnixTimestamp64Milli(created_at) AS created_ms{", terms" if terms else ""}
FROM {db}.messages
WHERE account_id = {{account_id:String}} AND agent_id = {{agent_id:String}}
  AND (thread_id, `offset`) IN arrayZip({{thread_ids:Array(String)}}, {{offsets:Array(UInt64)}})
LIMIT 1 BY thread_id, `offset`"""


def pending_vectors_sql(database: str) -> str:
    """Up to ``n`` stored messages without a vector of ``model`` yet: rows account_id,
    agent_id, thread_id, offset, content (params: model, n). An anti-join, so it needs no
    bookkeeping: rows of an old table, a replay or a restart are found the same way."""
    db = check_database(database)
    return f"""SELECT account_id, agent_id, thread_id, `offset`, content
FROM {db}.messages
WHERE (account_id, agent_id, thread_id, `offset`) NOT IN (
    SELECT account_id, agent_id, thread_id, `offset` FROM {db}.message_vectors
    WHERE model = {{model:String}})
LIMIT 1 BY account_id, agent_id, thread_id, `offset`
LIMIT {{n:UInt32}}"""


CARRY_KEY: Final = "account_id, agent_id, thread_id, `offset`"
"""A message's key, as the carry's statements name it."""


def carry_vectors_sql(old_database: str, new_database: str) -> str:
    """Copy into a rebuilt generation the vectors of the old one whose message is in the new
    generation with the same text (a replay rebuilds identical rows, so nothing needs to be
    embedded again; erased or changed messages are left to the vector step), but those the
    new generation has already (a resumed replay's seal copies only the rest)."""
    old, new = check_database(old_database), check_database(new_database)
    key = CARRY_KEY
    return f"""INSERT INTO {new}.message_vectors ({key}, model, vec)
SELECT {key}, model, vec FROM {old}.message_vectors
WHERE ({key}) IN (
    SELECT {key} FROM {new}.messages AS n
    INNER JOIN {old}.messages AS o USING ({key})
    WHERE n.content = o.content)
  AND ({key}, model) NOT IN (SELECT {key}, model FROM {new}.message_vectors)
LIMIT 1 BY {key}, model"""


def missing_vectors_sql(old_database: str, new_database: str) -> str:
    """Rows account_id, agent_id, thread_id, offset, model of the old generation's vectors
    the new one has not (yet): what :func:`carried_vectors_sql` may still carry. Reads keys
    only (the vectors stay on disk)."""
    old, new = check_database(old_database), check_database(new_database)
    key = CARRY_KEY
    return f"""SELECT DISTINCT {key}, model FROM {old}.message_vectors
WHERE ({key}, model) NOT IN (SELECT {key}, model FROM {new}.message_vectors)"""


def carried_vectors_sql(old_database: str, new_database: str) -> str:
    """Rows account_id, agent_id, thread_id, offset, model, vec of the old generation's
    vectors at the given keys whose message is in the new generation with the same text,
    one per key and model (params: arrays a, g, t, o, m, the keys of
    :func:`missing_vectors_sql`). The join reads the given keys' messages only."""
    old, new = check_database(old_database), check_database(new_database)
    key = CARRY_KEY
    keys = "arrayZip({a:Array(String)}, {g:Array(String)}, {t:Array(String)}, {o:Array(UInt64)})"
    with_model = (
        "arrayZip({a:Array(String)}, {g:Array(String)}, {t:Array(String)}, "
        "{o:Array(UInt64)}, {m:Array(String)})"
    )
    return f"""SELECT {key}, model, vec FROM {old}.message_vectors
WHERE ({key}, model) IN {with_model}
  AND ({key}) IN (
    SELECT {key}
    FROM (SELECT {key}, content FROM {new}.messages WHERE ({key}) IN {keys}) AS n
    INNER JOIN (SELECT {key}, content FROM {old}.messages WHERE ({key}) IN {keys}) AS o
    USING ({key})
    WHERE n.content = o.content)
LIMIT 1 BY {key}, model"""


def thread_visible_sql(database: str) -> str:
    """1 row with 1 when the thread is visible to the user (params: account_id, agent_id,
    thread_id, user_id), 0 otherwise -- the same rule as :func:`visible_threads_filter`."""
    db = check_database(database)
    return f"""SELECT count() = 0 OR countIf(user_id = {{user_id:String}}) > 0
FROM {db}.thread_users
WHERE account_id = {{account_id:String}} AND agent_id = {{agent_id:String}}
  AND thread_id = {{thread_id:String}}"""


def count_sql(database: str) -> str:
    """Rows stored for one thread, duplicates included (params: account_id, agent_id,
    thread_id) -- for replay checks and operators."""
    db = check_database(database)
    return f"""SELECT count(), uniqExact(`offset`) FROM {db}.messages
WHERE account_id = {{account_id:String}} AND agent_id = {{agent_id:String}}
  AND thread_id = {{thread_id:String}}"""


def literal(value: SqlParam) -> str:
    """A parameter value in the text form ClickHouse parses for ``{name:Type}`` (used by
    chdb, which takes parameter values as strings). Strings stay raw; arrays become quoted
    ClickHouse array literals."""
    if isinstance(value, str):
        return _escape(value)
    if isinstance(value, int):
        return str(value)
    return "[" + ",".join(_element(v) for v in value) + "]"


def _element(v: str | int | float) -> str:
    if isinstance(v, str):
        return quote(v)
    return str(v) if isinstance(v, int) else repr(float(v))


def _escape(s: str) -> str:
    # Parameter values are read in ClickHouse's "escaped" (TSV) text form.
    return (
        s.replace("\\", "\\\\")
        .replace("\t", "\\t")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\0", "\\0")
    )


def quote(s: str) -> str:
    """A ClickHouse string literal (for statements that take no parameters)."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _thread_tuples(threads: Sequence[tuple[str, str, str]]) -> str:
    """``threads`` as a quoted list of (account, agent, thread) tuples, for the erasure's
    statements (mutations take no query parameters)."""
    return ", ".join(f"({quote(a)}, {quote(g)}, {quote(t)})" for a, g, t in threads)


def erase_threads_sql(database: str, table: str, threads: Sequence[tuple[str, str, str]]) -> str:
    """Delete the rows of ``threads`` ((account, agent, thread) triples, at least one) from
    ``table`` synchronously (erasure), in one mutation: a mutation rewrites every part it
    touches, so one per table instead of one per thread and table. Values are quoted here
    because mutations take no query parameters."""
    if not threads:
        raise ValueError("erase_threads_sql needs at least one thread")
    db = check_database(database)
    return (
        f"ALTER TABLE {db}.{table} DELETE WHERE (account_id, agent_id, thread_id) IN "
        f"({_thread_tuples(threads)}) SETTINGS mutations_sync = 2"
    )


def optimize_sql(database: str, table: str) -> str:
    """Compact ``table`` now (erasure): on an ``EmbeddedRocksDB`` table RocksDB's manual
    compaction, which drops the values its deletes only shadowed in older files."""
    return f"OPTIMIZE TABLE {check_database(database)}.{table}"


def thread_keys_sql(database: str, threads: Sequence[tuple[str, str, str]]) -> str:
    """Rows account_id, agent_id, thread_id, offset, copies of every stored message of
    ``threads``, one statement: what an erasure reports it removed (the copies summed) and
    the keys of their text. Quoted like :func:`erase_threads_sql`, whose keys it reads."""
    db = check_database(database)
    return (
        f"SELECT account_id, agent_id, thread_id, `offset`, count() FROM {db}.messages "
        f"WHERE (account_id, agent_id, thread_id) IN ({_thread_tuples(threads)}) "
        "GROUP BY account_id, agent_id, thread_id, `offset`"
    )


def threads_present_sql(database: str, threads: Sequence[tuple[str, str, str]]) -> str:
    """Rows account_id, agent_id, thread_id of those of ``threads`` that have a stored
    message (the primary key's prefix: no scan). Quoted like :func:`erase_threads_sql`."""
    db = check_database(database)
    return (
        f"SELECT DISTINCT account_id, agent_id, thread_id FROM {db}.messages "
        f"WHERE (account_id, agent_id, thread_id) IN ({_thread_tuples(threads)})"
    )


def bind_for_text(params: Mapping[str, SqlParam]) -> dict[str, str]:
    return {k: literal(v) for k, v in params.items()}


# --- Bulk projection of raw journal records (the projector's fast path) ----------------------
JOURNAL_BATCH_FORMAT: Final = "JSONEachRow"
JOURNAL_BATCH_STRUCTURE: Final = (
    "v Nullable(Int64), type Nullable(String), id Nullable(String), ts Nullable(Int64), "
    "account_id Nullable(String), agent_id Nullable(String), thread_id Nullable(String), "
    "data Tuple(account_id Nullable(String), agent_id Nullable(String), "
    "thread_id Nullable(String), `offset` Nullable(Int64), message_id Nullable(String), "
    "seq Nullable(Int64), role Nullable(String), content Nullable(String), "
    "user_id Nullable(String), tool_calls Array(Tuple(id Nullable(String))), "
    "created_at Nullable(String))"
)
"""The envelope fields the projector reads, as ClickHouse parses them (``JSONEachRow``)."""
JOURNAL_BATCH_SETTINGS: Final = (
    "input_format_parallel_parsing = 0, input_format_null_as_default = 0, "
    "input_format_json_read_numbers_as_strings = 0, input_format_json_read_bools_as_numbers = 0, "
    "input_format_json_read_bools_as_strings = 0, input_format_json_read_objects_as_strings = 0, "
    "input_format_json_read_arrays_as_strings = 0, input_format_allow_errors_num = 0"
)
"""Strict parsing: a value of the wrong JSON type (a string for a number, an object for a
string, ``null`` for ``data`` or ``tool_calls``) fails the whole parse instead of being
coerced, so the batch goes to the Python decoder, which names the bad record."""

KIND_OTHER: Final = 0
"""Not a ``message.appended``: nothing to project."""
KIND_POSITION: Final = 1
"""A ``system``/``tool`` message: no row, but its seq is a read-your-writes position."""
KIND_ROW: Final = 2
"""A user or assistant message: one row (and a position)."""
KIND_PYTHON: Final = 3
"""Anything not in the canonical form the bulk path vouches for: the batch is decoded in
Python instead (same rules as :func:`memstream.schemas.events.decode` and
:func:`~memstream.projections.messages.rows.row_of_envelope`)."""


EVENT_ID_COLUMN: Final = ",\n    ifNull(id, '') AS event_id"
"""The optional last column of :func:`journal_batch_sql`."""


def journal_batch_sql(source: str, *, event_id: bool = False) -> str:
    """One row per journal record of ``source`` (a table expression the adapter supplies:
    ``file(...)`` for chdb, an external table for a server, both in
    :data:`JOURNAL_BATCH_FORMAT` with :data:`JOURNAL_BATCH_STRUCTURE`).

    Columns: ``kind`` (``KIND_*``) then the :data:`~.rows.MESSAGES_SCHEMA` columns, then
    (``event_id``) the envelope's ``id`` as ``event_id`` (a replay dedupes on it). A row is
    ``KIND_ROW`` only when every check of ``row_of_envelope`` passes on canonical values
    (``v`` 1, a known type, ids that match the envelope, a non-negative offset and seq, tool
    call ids present, ``created_at`` as ``YYYY-MM-DDTHH:MM:SS.mmmZ``); whatever the bulk path
    cannot vouch for is ``KIND_PYTHON``.
    """
    types = ", ".join(quote(t) for t in sorted(_EVENT_TYPES))
    return f"""SELECT
    multiIf(
        NOT (ifNull(v, 0) = 1 AND type IN ({types}) AND id IS NOT NULL AND ts IS NOT NULL
             AND account_id IS NOT NULL AND agent_id IS NOT NULL), {KIND_PYTHON},
        type != 'message.appended', {KIND_OTHER},
        data.role IN ('system', 'tool'),
            if(ifNull(data.seq, 0) >= 0, {KIND_POSITION}, {KIND_PYTHON}),
        data.role IN ('user', 'assistant')
          AND data.account_id IS NOT NULL AND data.account_id = account_id
          AND data.agent_id IS NOT NULL AND data.agent_id = agent_id
          AND thread_id IS NOT NULL AND data.thread_id IS NOT NULL
          AND data.thread_id = thread_id
          AND data.`offset` IS NOT NULL AND data.`offset` >= 0
          AND data.message_id IS NOT NULL AND data.content IS NOT NULL
          AND ifNull(data.seq, 0) >= 0
          AND arrayAll(c -> c.id IS NOT NULL, data.tool_calls)
          AND match(ifNull(data.created_at, ''),
                    '^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}[.][0-9]{{3}}Z$')
          AND parseDateTime64BestEffortOrNull(data.created_at, 3, 'UTC') IS NOT NULL,
            {KIND_ROW},
        {KIND_PYTHON}) AS kind,
    ifNull(account_id, '') AS account_id,
    ifNull(agent_id, '') AS agent_id,
    ifNull(thread_id, '') AS thread_id,
    toUInt64(greatest(ifNull(data.`offset`, 0), 0)) AS `offset`,
    ifNull(data.message_id, '') AS message_id,
    ifNull(data.role, '') AS role,
    ifNull(data.content, '') AS content,
    ifNull(data.user_id, '') AS user_id,
    arrayMap(c -> ifNull(c.id, ''), data.tool_calls) AS tool_call_ids,
    ifNull(parseDateTime64BestEffortOrNull(data.created_at, 3, 'UTC'),
           toDateTime64(0, 3, 'UTC')) AS created_at,
    toUInt64(greatest(ifNull(data.seq, 0), 0)) AS seq{EVENT_ID_COLUMN if event_id else ""}
FROM {source}
SETTINGS {JOURNAL_BATCH_SETTINGS}"""
