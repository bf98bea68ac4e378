"""All settings, in one pydantic-settings class, read from ``MEMSTREAM_*`` variables.

Built once in the entrypoint (``memstream.infra.cli``) and passed down; nothing reads the
environment anywhere else. An empty address means "launch the embedded server" (only
``memstream up`` and the test suite do that); a set address means "use this server".
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memstream.schemas.topics import DEFAULT_PREFIX


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSTREAM_", extra="ignore")

    # --- where things live -----------------------------------------------------------------
    data_dir: Path = Field(default=Path(".memstream"), description="Root of embedded data.")
    environment: str = Field(default="default", description="Deployment environment name.")

    # --- journal (SlateDB) -----------------------------------------------------------------
    journal_url: str = Field(
        default="",
        description="Object store URL for the journal (s3://bucket/prefix); empty = local "
        "folder <data_dir>/journal.",
    )
    journal_path: str = Field(default="journal", description="DB path inside the store.")
    journal_flush_interval_ms: int = Field(default=5, ge=1, le=1000)
    journal_max_batch: int = Field(default=512, ge=1)
    journal_eager_flush: bool = Field(
        default=True,
        description="Flush the WAL right after each group commit instead of waiting for the "
        "next flush tick (lower latency; one object-store PUT per batch).",
    )
    journal_reader_poll_ms: int = Field(
        default=20, ge=1, description="Manifest poll of journal readers in other processes."
    )
    relay_linger_ms: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="The journal relay starts a pass at most this often: appends that land "
        "within it of the last pass go to Kafka, and through every processor, as one batch. "
        "A pass after a longer quiet starts at once (0 = a pass per durable batch).",
    )

    # --- kafka ------------------------------------------------------------------------------
    kafka_bootstrap: str = Field(default="", description="host:port[,host:port]; empty = embedded.")
    kafka_broker: Literal["auto", "kafka", "tansu"] = Field(
        default="auto", description="Embedded broker: Apache Kafka (needs java+mvn) or Tansu."
    )
    kafka_version: str = Field(default="4.1.1")
    topic_prefix: str = DEFAULT_PREFIX
    partitions: int = Field(default=4, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    kafka_metadata_max_age_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How often producers and consumers re-read topic metadata: a partition "
        "added to a topic is written and consumed within about this long (aiokafka's own "
        "default, 5 min, left new partitions unused that long).",
    )
    seal_topics: bool = Field(
        default=True,
        description="Encrypt what is published to Kafka with per-thread / per-user data keys "
        "(crypto-shredding: erasure destroys the key; docs/owning-memory.md).",
    )
    data_key_cache_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a process caches a data key: after an erasure, every process "
        "stops opening the erased records within this time.",
    )
    erasure_rewrite_tables: bool = Field(
        default=True,
        description="At each erasure, rewrite the Postgres tables it deleted from "
        "(memory_entries, memory_outbox, threads, data_keys: VACUUM FULL), so the erased bytes "
        "(content, metadata, the destroyed data keys) leave the data files at once. Locks each "
        "table while it is rewritten (~1.8 s per 1M narrow rows, measured; a lock not had in "
        "5 s falls back to a plain VACUUM with a warning). Off: a plain VACUUM, whose erased "
        "bytes may stay in the pages' free space until reused (docs/owning-memory.md).",
    )

    # --- embedded servers and readiness (memstream up) --------------------------------------
    server_restart_tries: int = Field(
        default=5,
        ge=0,
        description="Restarts of a dead embedded server (Postgres, Valkey, the broker) before "
        "memstream up gives up on it (0: never restart).",
    )
    server_restart_max_backoff_s: float = Field(
        default=15.0, gt=0, description="Longest wait before one restart try (0.5 s doubling)."
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        default="auto",
        description="The event loop of memstream up / api / worker: auto = uvloop when it is "
        "installed (the server extra), else asyncio's.",
    )
    switch_interval_s: float = Field(
        default=0.0002,
        gt=0,
        le=0.1,
        description="Python's thread switch interval (sys.setswitchinterval) in memstream up / "
        "api / worker: how long a worker thread (the lexical index's writer, chdb, the "
        "embedder) waits for the GIL before the event loop must hand it over. Python's "
        "5 ms default let a busy loop starve them (docs/operations.md).",
    )
    readiness_interval_s: float = Field(
        default=1.0, gt=0, description="How often /healthz's probes run in the background."
    )

    # --- postgres / redis -------------------------------------------------------------------
    postgres_dsn: SecretStr = Field(default=SecretStr(""), description="empty = embedded")
    redis_url: SecretStr = Field(default=SecretStr(""), description="empty = embedded")
    postgres_acquire_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait for a free Postgres connection (every route and loop; then 503).",
    )
    postgres_lock_timeout_s: float = Field(
        default=5.0, gt=0, description="Memory import: longest wait for a row or capacity lock."
    )
    postgres_statement_timeout_s: float = Field(
        default=30.0, gt=0, description="Memory import: longest statement of one line."
    )

    # --- object store (summary.json) ----------------------------------------------------------
    object_store_url: str = Field(default="", description="s3://bucket/prefix; empty = local.")

    # --- qdrant / clickhouse ----------------------------------------------------------------
    qdrant_url: str = Field(default="", description="Qdrant server URL; empty = qdrant-edge.")
    qdrant_api_key: SecretStr = SecretStr("")
    clickhouse_url: str = Field(default="", description="ClickHouse server; empty = chdb.")
    clickhouse_database: str = Field(
        default="memstream", description="Database of the transcript-search tables."
    )
    transcript_index: Literal["auto", "tantivy", "clickhouse"] = Field(
        default="auto",
        description="Where transcript search's BM25 side finds its candidates: 'tantivy', "
        "a Tantivy index beside embedded chdb (<data_dir>/tantivy; re-scored with the same "
        "statistics); 'clickhouse', the posting lists in ClickHouse; 'auto', tantivy with "
        "embedded chdb when installed, else clickhouse (docs/transcript-search.md).",
    )
    transcript_vector_index: Literal["auto", "qdrant", "clickhouse"] = Field(
        default="auto",
        description="Where transcript search's dense side finds its nearest messages: "
        "'qdrant', a qdrant-edge shard beside embedded chdb (<data_dir>/vectors; an exact "
        "scan, 5-7x cheaper than ClickHouse's); 'clickhouse', a scan of message_vectors in "
        "ClickHouse; 'auto', qdrant with embedded chdb, else clickhouse "
        "(docs/transcript-search.md).",
    )
    memory_index_process: bool = Field(
        default=True,
        description="Keep the memory index's qdrant-edge collections (no qdrant_url) in a "
        "child process of their own: qdrant-edge holds the GIL for the whole of a query, so "
        "in the serving process a recall stops every other request for its length. false: "
        "in this process (docs/memory.md).",
    )
    transcript_vector_process: bool = Field(
        default=True,
        description="Keep each transcript vector index (qdrant-edge) in a child process of "
        "its own: qdrant-edge holds the GIL for the whole of a query, so in the serving "
        "process a search's walk over a large agent stops every other request for its "
        "length (~11 ms at 1M messages). false: in this process (docs/transcript-search.md).",
    )
    transcript_dense: bool = Field(
        default=True,
        description="Transcript search's dense side: embed each projected message (behind "
        "the message projector, at the lowest CPU priority) and fuse dense similarity with "
        "BM25 (docs/transcript-search.md). false: BM25 only (the offline embedder follows "
        "at tens of messages/s; a paraphrased question finds only the embedded part).",
    )

    # --- models -----------------------------------------------------------------------------
    llm_provider: Literal["offline", "openai"] = "offline"
    embedding_provider: Literal["offline", "openai"] = "offline"
    embedding_query_threads: int = Field(
        default=1,
        ge=0,
        description="Offline embedder: threads embedding one search query (0 = every core). "
        "One is steadier on a busy machine; more lower an idle machine's latency "
        "(docs/embeddings.md, 'Threads').",
    )
    openai_api_key: SecretStr = SecretStr("")
    openai_base_url: str = ""
    openai_chat_model: str = "gpt-4o-mini"
    openai_embedding_model: str = "text-embedding-3-small"
    openai_timeout_s: float = Field(
        default=20.0, gt=0, description="Per-attempt timeout of an OpenAI call (SDK default: 600)."
    )
    openai_max_retries: int = Field(
        default=1, ge=0, le=5, description="The SDK's own retries of one call (SDK default: 2)."
    )
    semantic_screen: bool = Field(
        default=True,
        description="Reject memory content semantically close to prompt injections "
        "(offline embedder; bench/screening.py).",
    )

    # --- surfaces ---------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_keys: str = Field(default="", description="'account:key,account:key' seeded at start-up.")
    admin_token: SecretStr = Field(
        default=SecretStr(""),
        description="Token for /admin routes (produce, replay); `memstream up` makes one.",
    )

    # --- processors -------------------------------------------------------------------------
    consumer_session_timeout_s: float = 6.0
    consumer_heartbeat_interval_s: float = 0.5
    consumer_stall_s: float = Field(
        default=30.0,
        gt=0,
        description="A processor holding a partition with records it has not handled, none "
        "handled for this long, reads it again from what it handled; if that does not help "
        "within as long again (or a poll does not return), its Kafka consumer is built anew.",
    )
    read_your_writes_timeout_s: float = 5.0
    read_your_writes_mark_ttl_s: int = Field(
        default=7 * 24 * 3600,
        ge=1,
        description="Lifetime of an idle key's applied position in Redis (read-your-writes).",
    )

    # --- thread memory (summaries) -----------------------------------------------------------
    summary_token_budget: int = Field(default=512, ge=16, description="Max tokens of a summary.")
    summary_lock_ttl_s: float = Field(
        default=120.0,
        gt=0,
        description="Longest a summarizer holds a thread's lock (its lease is renewed up to "
        "this; a waiter gives up after it).",
    )
    summary_lock_lease_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a crashed summarizer's thread lock outlives it: the holder "
        "renews it every third of this while it works (up to summary_lock_ttl_s).",
    )
    summary_guard_ttl_s: int = Field(
        default=600, ge=1, description="Flush-and-summarize guard expiry (re-request after)."
    )
    flush_timeout_s: float = Field(default=30.0, gt=0, description="Pre-compaction flush limit.")

    def model_call_budget_s(self) -> float:
        """The longest one model call can take: every attempt's timeout plus the SDK's
        backoff between attempts (at most 2 s each at these retry counts)."""
        return self.openai_timeout_s * (self.openai_max_retries + 1) + 2.0 * self.openai_max_retries

    @model_validator(mode="after")
    def _calls_fit_in_the_summary_lock(self) -> Settings:
        """One summary job (the flush, then one summary call) must end before its lock can
        expire, or a second worker could summarize the same span meanwhile."""
        need = self.flush_timeout_s + self.model_call_budget_s() + 10.0
        if self.summary_lock_ttl_s < need:
            raise ValueError(
                f"summary_lock_ttl_s ({self.summary_lock_ttl_s:g}) must be at least "
                f"flush_timeout_s + the model call budget + 10 s = {need:g} "
                "(lower openai_timeout_s / openai_max_retries or raise the lock)"
            )
        return self

    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    def seeded_api_keys(self) -> list[tuple[str, str]]:
        """Parse ``api_keys``; raises ValueError naming the bad pair."""
        out: list[tuple[str, str]] = []
        for raw in filter(None, (p.strip() for p in self.api_keys.split(","))):
            account, sep, key = raw.partition(":")
            if not sep or not account or not key:
                raise ValueError(f"MEMSTREAM_API_KEYS: expected account:key, got {raw!r}")
            out.append((account, key))
        return out
