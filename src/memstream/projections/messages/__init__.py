"""The ClickHouse projection of the journal for transcript search.

- :mod:`.rows` -- the pure event -> row mapping (user and assistant text only) and Arrow encoding
- :mod:`.sql` -- every statement (DDL, ranked search, visibility), shared by both adapters
- :mod:`.store` -- :class:`MessageStore`: schema, durable batch writes, search
- :mod:`.lexical_index` -- the Tantivy index beside embedded chdb (BM25's candidates)
- :mod:`.chdb_engine` -- embedded chdb adapter (default)
- :mod:`.clickhouse_engine` -- ClickHouse server adapter (clickhouse-connect)
"""

from __future__ import annotations

from pathlib import Path

from memstream.errors import InvalidRequest
from memstream.infra.settings import Settings
from memstream.projections.messages import lexical_index
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.clickhouse_engine import ClickHouseConnectEngine
from memstream.projections.messages.engine import ClickHouseEngine
from memstream.projections.messages.rows import (
    SEARCHABLE_ROLES,
    MessageRow,
    row_of_envelope,
    row_of_message,
)
from memstream.projections.messages.sql import DEFAULT_DATABASE, SearchSpec, query_words
from memstream.projections.messages.store import MessageStore, SearchHit

__all__ = [
    "DEFAULT_DATABASE",
    "SEARCHABLE_ROLES",
    "ChdbEngine",
    "ClickHouseConnectEngine",
    "ClickHouseEngine",
    "MessageRow",
    "MessageStore",
    "SearchHit",
    "SearchSpec",
    "build_engine",
    "index_root",
    "query_words",
    "row_of_envelope",
    "row_of_message",
    "store_from_settings",
    "vector_root",
]


def build_engine(clickhouse_url: str, chdb_path: str | Path) -> ClickHouseEngine:
    """The server adapter when a URL is configured, else embedded chdb at ``chdb_path``."""
    if clickhouse_url:
        return ClickHouseConnectEngine(clickhouse_url)
    return ChdbEngine(chdb_path)


def store_from_settings(settings: Settings) -> MessageStore:
    """The message store the settings ask for: ``clickhouse_url`` or chdb under
    ``<data_dir>/clickhouse`` (one process per directory: chdb locks it)."""
    engine = build_engine(settings.clickhouse_url, settings.resolved_data_dir() / "clickhouse")
    return MessageStore(
        engine,
        settings.clickhouse_database,
        index_root=index_root(settings),
        vector_root=vector_root(settings),
        vector_process=settings.transcript_vector_process,
    )


def vector_root(settings: Settings) -> Path | None:
    """Where the vector indexes live (``<data_dir>/vectors``), or None when the dense side
    scans ``message_vectors`` in ClickHouse: a ClickHouse server (its writers and readers
    may be other processes) or ``transcript_vector_index = "clickhouse"``."""
    choice = settings.transcript_vector_index
    if choice == "clickhouse":
        return None
    if settings.clickhouse_url:
        if choice == "qdrant":
            raise InvalidRequest(
                "transcript_vector_index=qdrant needs embedded chdb (no clickhouse_url): a "
                "ClickHouse server's writers are not the index's process",
                field="transcript_vector_index",
            )
        return None
    return settings.resolved_data_dir() / "vectors"


def index_root(settings: Settings) -> Path | None:
    """Where the lexical indexes live (``<data_dir>/tantivy``), or None when BM25 reads the
    posting lists: a ClickHouse server (its processes may be many, on many machines),
    ``transcript_index = "clickhouse"``, or Tantivy not installed under ``auto``."""
    choice = settings.transcript_index
    if choice == "clickhouse":
        return None
    if settings.clickhouse_url:
        if choice == "tantivy":
            raise InvalidRequest(
                "transcript_index=tantivy needs embedded chdb (no clickhouse_url): a "
                "ClickHouse server's readers are not the index's process",
                field="transcript_index",
            )
        return None
    if not lexical_index.available():
        if choice == "tantivy":
            raise InvalidRequest(
                "transcript_index=tantivy needs the tantivy package (pip install "
                "'memstream[embedded]')",
                field="transcript_index",
            )
        return None
    return settings.resolved_data_dir() / "tantivy"
