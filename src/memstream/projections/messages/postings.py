"""The posting lists of transcript search: one row per (message, term), and the SQL over them.

Pure: builds statements and their parameters (the rules that use the rows are in
:mod:`memstream.projections.messages.ranking`).

``message_terms`` holds, for every stored message and each distinct term of it, the term's
positions (1-based, as ``arrayEnumerate`` numbers the ``terms`` array), the message's length
in terms and its time. It is filled *by ClickHouse inside the insert into* ``messages``
(a materialized view, :func:`postings_ddl`), so both projector paths, replays and old tables
(:func:`backfill_sql`) get the same rows, and the projector sends nothing more.
``ReplacingMergeTree`` ordered by ``(account_id, agent_id, term, thread_id, offset)``: a
term's postings are one contiguous range per part, and a replayed or redelivered message
has the same key, so duplicates collapse on merge; before a merge the statistics read
``FINAL`` (a merge of sorted ranges) and the scoring takes one copy per key, so each message
counts and scores once.

Why (docs/transcript-search.md, "Search latency at 1M"): the scan over ``messages`` read the
whole ``terms`` array of every candidate; the candidates of a mid-frequency word sit one or
two per 1,024-row granule, so a word in 600 messages read ~600k arrays (174 ms of a 190 ms
query at 1M messages). A term's postings are a few narrow rows side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from memstream.projections.messages.sql import (
    BM25_B,
    BM25_K1,
    SEARCH_SETTINGS,
    SearchSpec,
    SqlParam,
    check_database,
    spec_filter,
    spec_filter_params,
)

POSTINGS_TABLE: Final = "message_terms"
POSTINGS_VIEW: Final = "message_terms_mv"
POSTINGS_VIEW_VERSION: Final = "memstream postings 2"
"""The view's comment: which :func:`postings_select` it runs. A view without it (made before
the SQL lost its ``GROUP BY``) is upgraded in place at start (``MessageStore.ensure_schema``);
bump it whenever :func:`postings_select` changes."""
POSTINGS_FILLING: Final = "message_terms_filling"
"""Marker table: the one-off fill of the postings from ``messages`` has not finished (a start
interrupted during it fills again)."""
POSTINGS_DEFERRED: Final = "message_terms_deferred"
"""Marker table: this database's postings wait for ``MessageStore.seal_postings`` (a replay's
bulk load, which skips the view)."""


def postings_select(source: str) -> str:
    """The postings of the messages in ``source`` (a table): one row per message and distinct
    term, its positions sorted.

    Per message, without a ``GROUP BY``: the (distinct-term number, position) pairs of its
    ``terms`` are sorted (integers: ``arrayEnumerateDense`` numbers each distinct term) and
    split where the term number changes, so each piece is one term's positions in order.
    The rows are those of grouping ``ARRAY JOIN terms`` by (message, term) -- checked equal
    row for row in ``tests/integration/test_search_postings.py`` -- measured 1.2-2.0x faster
    for the insert-time view and 2.3-3x for a one-off fill (docs/operations.md). One
    difference: two copies of one message in the same insert give two copies of each posting
    (collapsed on merge and counted once by the queries, as copies across inserts always
    were) where the grouping gave one posting with every position twice."""
    return f"""SELECT account_id, agent_id, terms[g[1].2] AS term, thread_id, `offset`,
       created_at, toUInt32(length(terms)) AS doc_len,
       arrayMap(x -> toUInt32(x.2), g) AS positions
FROM (
    SELECT account_id, agent_id, thread_id, `offset`, created_at, terms,
           arraySort(arrayZip(arrayEnumerateDense(terms), arrayEnumerate(terms))) AS pairs
    FROM {source}
)
ARRAY JOIN arraySplit((x, y) -> x.1 != y.1, pairs, arrayShiftRight(pairs, 1)) AS g"""


def grouped_postings_select(source: str) -> str:
    """:func:`postings_select` as it was (grouping every (message, term)): the reference its
    rows are tested against, and what views made before it still run."""
    return f"""SELECT account_id, agent_id, term, thread_id, `offset`,
       any(created_at) AS created_at, any(length(terms)) AS doc_len,
       arraySort(groupArray(toUInt32(pos))) AS positions
FROM {source}
ARRAY JOIN terms AS term, arrayEnumerate(terms) AS pos
GROUP BY account_id, agent_id, term, thread_id, `offset`"""


def postings_table_ddl(database: str, table: str = POSTINGS_TABLE) -> str:
    db = check_database(database)
    return f"""CREATE TABLE IF NOT EXISTS {db}.{check_database(table)} (
    account_id LowCardinality(String),
    agent_id LowCardinality(String),
    term String,
    thread_id String,
    `offset` UInt64,
    created_at DateTime64(3, 'UTC'),
    doc_len UInt32,
    positions Array(UInt32)
) ENGINE = ReplacingMergeTree
ORDER BY (account_id, agent_id, term, thread_id, `offset`)"""


def postings_view_ddl(database: str) -> str:
    """The materialized view that writes the postings of every insert into ``messages``."""
    db = check_database(database)
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{POSTINGS_VIEW} TO {db}.{POSTINGS_TABLE} "
        f"COMMENT '{POSTINGS_VIEW_VERSION}' AS {postings_select(f'{db}.messages')}"
    )


def postings_view_upgrade(database: str) -> tuple[str, str]:
    """The two statements that make an existing view run :func:`postings_select`: its query
    replaced in place (``MODIFY QUERY`` swaps it under the view's lock, so no insert runs
    without postings and none twice), then its version comment."""
    db = check_database(database)
    return (
        f"ALTER TABLE {db}.{POSTINGS_VIEW} MODIFY QUERY {postings_select(f'{db}.messages')}",
        f"ALTER TABLE {db}.{POSTINGS_VIEW} MODIFY COMMENT '{POSTINGS_VIEW_VERSION}'",
    )


def backfill_sql(database: str, table: str) -> str:
    """Fill ``table`` (a new postings table) with the postings of every stored message: the
    one-off upgrade of a ``messages`` table made before the postings existed."""
    db = check_database(database)
    return f"INSERT INTO {db}.{check_database(table)} {postings_select(f'{db}.messages')}"


_KEY_HASH: Final = "cityHash64(thread_id, `offset`)"
"""The membership test of the common terms' postings compares one 64-bit hash of the message
key, not the (String, UInt64) tuple: 18 ms against 108 ms for 147k postings tested against
18k candidates at 1M messages. A collision can only let a message holding no essential term
into the candidates; it then scores at most the common terms' bounds, so either it stays
below the ``k``-th best or the check of :func:`~.ranking.exact_with` fails and the search
runs again with more essential terms: never a wrong result."""


_BEST_K: Final = f"""ORDER BY bm25 DESC, created_ms DESC, `offset` DESC, thread_id
LIMIT {{k:UInt32}}
SETTINGS {SEARCH_SETTINGS}"""
"""How a scoring statement ends: its best ``k`` by BM25, then newest (the result's order)."""


def _scope(spec: SearchSpec) -> str:
    tenant = "account_id = {account_id:String} AND agent_id = {agent_id:String}"
    if spec.thread_id is not None:
        return tenant + " AND thread_id = {thread_id:String}"
    return tenant


def _params(spec: SearchSpec) -> dict[str, SqlParam]:
    return {
        "account_id": spec.account_id,
        "agent_id": spec.agent_id,
        **spec_filter_params(spec),
        "terms": list(spec.words),
    }


def term_stats_sql(
    database: str, spec: SearchSpec, avg_len: float
) -> tuple[str, dict[str, SqlParam]]:
    """Per query term held by a visible message (in scope): term, document frequency (each
    message once, before merges too), its highest tf, the shortest message holding it and
    its highest tf part (:class:`~.ranking.TermStats`; the tf part is BM25's factor after
    the idf, with the agent's average length ``avg_len``) -- the exact statistics BM25
    needs, and what bounds the term's contribution (:func:`~.ranking.impact_bound`). Terms
    no visible message holds have no row."""
    db = check_database(database)
    part = (
        f"length(positions) * ({BM25_K1} + 1) / (length(positions) + {BM25_K1} * "
        f"(1 - {BM25_B} + {BM25_B} * doc_len / greatest({{avg_len:Float64}}, 1.0)))"
    )
    sql = f"""SELECT term, count(), max(length(positions)), min(doc_len), max({part})
FROM {db}.{POSTINGS_TABLE} FINAL
WHERE {_scope(spec)}
  AND term IN {{terms:Array(String)}}
  AND {spec_filter(db, spec)}
GROUP BY term
SETTINGS {SEARCH_SETTINGS}"""
    params = _params(spec)
    params["avg_len"] = str(avg_len)
    return sql, params


def one_term_sql(
    database: str, spec: SearchSpec, stats: tuple[float, float], k: int
) -> tuple[str, dict[str, SqlParam]]:
    """:func:`score_sql` for a one-word query (``dfs=None``, every candidate), the same rows
    and order, without its per-message grouping of arrays: a message holds one posting of
    the term (copies before a merge are collapsed by ``any``), so its tf is the posting's
    position count (``positions.size0``: the array sizes only) and df the number of visible
    messages holding it. The positions are returned empty: one word has no pair for the
    proximity bonus (:func:`~.ranking.proximity`)."""
    db = check_database(database)
    sql = f"""WITH {{n_docs:Float64}} AS n_docs, greatest({{avg_len:Float64}}, 1.0) AS avg_len
SELECT thread_id, `offset`, created_ms, bm25, [tf1] AS tf, doc_len, [[]]::Array(Array(UInt32)) AS positions, [df1] AS df
FROM (
    SELECT *,
        log(1 + (n_docs - df1 + 0.5) / (df1 + 0.5)) * tf1 * ({BM25_K1} + 1)
            / (tf1 + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * doc_len / avg_len)) AS bm25
    FROM (
        SELECT *, count() OVER () AS df1
        FROM (
            SELECT thread_id, `offset`,
                   toUnixTimestamp64Milli(any(created_at)) AS created_ms,
                   any(doc_len) AS doc_len,
                   toUInt64(any(positions.size0)) AS tf1
            FROM {db}.{POSTINGS_TABLE}
            WHERE {_scope(spec)}
              AND term = {{term:String}}
              AND {spec_filter(db, spec)}
            GROUP BY thread_id, `offset`
        )
    )
)
{_BEST_K}"""
    params = _params(spec)
    params.update(
        {"n_docs": str(stats[0]), "avg_len": str(stats[1]), "k": k, "term": spec.words[0]}
    )
    return sql, params


def score_sql(
    database: str,
    spec: SearchSpec,
    dfs: Sequence[int] | None,
    stats: tuple[float, float],
    essential: Sequence[str],
    k: int,
) -> tuple[str, dict[str, SqlParam]]:
    """BM25's best ``k`` among the visible messages holding an ``essential`` term (all the
    query's terms: every candidate), each scored on *all* query terms. Rows: thread_id,
    offset, created_at (epoch ms), bm25, tf per query term, length, for each query term its
    positions in the message (empty when absent), and the document frequencies used. Ordered
    by bm25 then newest, as the result is; one row per message.

    Not ``FINAL``: a message's postings are grouped by its key, and a copy of a posting
    (a replay or redelivery before a merge) is ignored, since each term's positions are taken
    from its first entry (``indexOf``).

    ``dfs`` are the query terms' document frequencies (:func:`term_stats_sql`); None (only
    with every term essential) counts them over the candidates in the same query, which saves
    a round trip where candidates are few (one thread). ``stats`` are the agent's (messages,
    average length). The score is the formula the scan over ``messages``
    computed, term for term, so rankings are unchanged. With fewer essential terms than
    query terms, the other terms' postings are read only for the essential candidates (a
    membership test on two narrow columns, not a grouping of every message holding them):
    :func:`~.ranking.plan` says when that is exact.
    """
    db = check_database(database)
    words = list(spec.words)
    narrow = len(essential) < len(words)
    membership = (
        f"""AND (term IN {{essential:Array(String)}} OR {_KEY_HASH} IN (
        SELECT {_KEY_HASH} FROM {db}.{POSTINGS_TABLE}
        WHERE {_scope(spec)} AND term IN {{essential:Array(String)}}))"""
        if narrow
        else ""
    )
    # df: given, or counted over the candidates (every message holding a term, when all
    # terms are essential), as the scan over ``messages`` counted it
    df = "{dfs:Array(UInt64)}" if dfs is not None else "sumForEach(tf_hit) OVER ()"
    sql = f"""WITH {{n_docs:Float64}} AS n_docs, greatest({{avg_len:Float64}}, 1.0) AS avg_len
SELECT thread_id, `offset`, created_ms, bm25, tf, doc_len, positions, df
FROM (
    SELECT *,
        arraySum(arrayMap((tf_i, df_i) -> log(1 + (n_docs - df_i + 0.5) / (df_i + 0.5)) * tf_i
                 * ({BM25_K1} + 1)
                 / (tf_i + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * doc_len / avg_len)),
                 tf, df)) AS bm25
    FROM (
        SELECT *, {df} AS df
        FROM (
            SELECT thread_id, `offset`, created_ms, doc_len,
                arrayMap(i -> arrayElement(plists, indexOf(term_nos, i)),
                         arrayEnumerate({{terms:Array(String)}})) AS positions,
                arrayMap(p -> toUInt64(length(p)), positions) AS tf,
                arrayMap(n -> toUInt64(n > 0), tf) AS tf_hit
            FROM (
                SELECT thread_id, `offset`,
                       toUnixTimestamp64Milli(any(created_at)) AS created_ms,
                       any(doc_len) AS doc_len,
                       groupArray(toUInt32(indexOf({{terms:Array(String)}}, term))) AS term_nos,
                       groupArray(positions) AS plists
                FROM {db}.{POSTINGS_TABLE}
                WHERE {_scope(spec)}
                  AND term IN {{terms:Array(String)}}
                  {membership}
                  AND {spec_filter(db, spec)}
                GROUP BY thread_id, `offset`
            )
        )
    )
)
{_BEST_K}"""
    params = _params(spec)
    params.update({"n_docs": str(stats[0]), "avg_len": str(stats[1]), "k": k})
    if dfs is not None:
        params["dfs"] = list(dfs)
    if narrow:
        params["essential"] = list(essential)
    return sql, params
