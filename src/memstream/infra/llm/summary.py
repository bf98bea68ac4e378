"""The offline progressive summarizer: extractive, deterministic, within a token budget.

How it works: the previous summary's lines and the new messages' sentences (each labelled
with its speaker, ``User: ...``) are scored by TF-IDF informativeness plus centrality (cosine
to the span's centroid); lines carried over from the previous summary and sentences that state
an explicit fact ("my name is ...", see :mod:`memstream.infra.llm.facts`) get a boost, filler
("ok, thanks!") a penalty. The best lines are kept greedily while the result fits the budget
(the previous summary may take at most 60 % of it while new messages compete, so each version
says something about its new span), near-duplicates dropped, and the kept lines are written back in conversation order (previous
summary first), one per line.

What it can do: keep the most informative sentences verbatim, keep old facts across versions
(the previous summary competes with, and is favoured over, the new span), never exceed the
budget, and give the same output for the same input on every machine.

What it cannot do: paraphrase, merge, resolve pronouns, or reason about what matters the way
an LLM does; a fact that was only implied is lost; when the budget is small, older lines are
eventually displaced by more informative new ones. Use the OpenAI provider for abstractive
summaries.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from memstream.infra.llm.facts import RULES
from memstream.infra.llm.ports import ROLE_LABELS
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.records import Message

_SENTENCE_SPLIT: Final = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD: Final = re.compile(r"\w+", re.UNICODE)
_MAX_UNIT_WORDS: Final = 60
_PREVIOUS_BOOST: Final = 1.5
_FACT_BOOST: Final = 1.6
_ROLE_WEIGHT: Final[dict[str, float]] = {
    "user": 1.1,
    "assistant": 1.0,
    "system": 0.9,
    "tool": 0.6,
}
_DUPLICATE_JACCARD: Final = 0.8
_PREVIOUS_SHARE: Final = 0.6
_STOPWORDS: Final = frozenset(
    """a an the and or but if then so of to in on at by for with from as is are was were be
    been being it its this that these those there here i me my we our you your he she they them
    his her their do does did done have has had not no yes ok okay just very really can could
    would should will shall may might must also too than what which who whom how when where why
    about into over under again more most some any all each both few such only own same up down
    out off thanks thank please sure great good well let lets""".split()  # noqa: SIM905 - a word list reads better as text
)


@dataclass(frozen=True, slots=True)
class _Unit:
    order: int
    text: str
    terms: tuple[str, ...]
    weight: float
    from_previous: bool


def _terms(text: str) -> tuple[str, ...]:
    return tuple(
        w for w in (m.lower() for m in _WORD.findall(text)) if len(w) > 1 and w not in _STOPWORDS
    )


def _chunks(sentence: str) -> list[str]:
    words = sentence.split()
    return [" ".join(words[i : i + _MAX_UNIT_WORDS]) for i in range(0, len(words), _MAX_UNIT_WORDS)]


_NAMED_GROUP: Final = re.compile(r"\(\?P<\w+>")


def _unnamed(regex: str) -> str:
    """``regex`` with its named groups made plain, so several can share one pattern."""
    return _NAMED_GROUP.sub("(?:", regex)


#: one search for "does any fact rule match": the rules' alternation (each rule's named
#: groups made plain; none refers back to one). Matches exactly when one of the rules does.
_ANY_FACT: Final = re.compile(
    "|".join(f"(?:{_unnamed(rule.pattern.pattern)})" for rule in RULES), re.IGNORECASE
)


def _states_fact(text: str) -> bool:
    return _ANY_FACT.search(text) is not None


def _units(previous: str | None, messages: Sequence[Message]) -> list[_Unit]:
    units: list[_Unit] = []
    seen: set[str] = set()

    def add(text: str, weight: float, *, from_previous: bool = False) -> None:
        if text in seen:
            return
        seen.add(text)
        units.append(_Unit(len(units), text, _terms(text), weight, from_previous))

    for line in (previous or "").splitlines():
        text = line.strip()
        if text:
            fact = text.startswith(ROLE_LABELS["user"] + ":") and _states_fact(text)
            add(text, _PREVIOUS_BOOST * (_FACT_BOOST if fact else 1.0), from_previous=True)
    for msg in messages:
        label = ROLE_LABELS.get(msg.role, msg.role)
        base = _ROLE_WEIGHT.get(msg.role, 1.0)
        for sentence in _SENTENCE_SPLIT.split(msg.content):
            for chunk in _chunks(sentence.strip()):
                w = base * (_FACT_BOOST if msg.role == "user" and _states_fact(chunk) else 1.0)
                add(f"{label}: {chunk}", w)
    return units


def _scores(units: Sequence[_Unit]) -> list[float]:
    n = len(units)
    df: Counter[str] = Counter()
    for u in units:
        df.update(set(u.terms))
    idf = {t: math.log((n + 1) / (c + 1)) + 1.0 for t, c in df.items()}
    vectors: list[dict[str, float]] = []
    for u in units:
        tf = Counter(u.terms)
        vec = {t: (1.0 + math.log(c)) * idf[t] for t, c in tf.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        vectors.append({t: v / norm for t, v in vec.items()})
    centroid: dict[str, float] = {}
    for vec in vectors:
        for t, v in vec.items():
            centroid[t] = centroid.get(t, 0.0) + v / n
    c_norm = math.sqrt(sum(v * v for v in centroid.values())) or 1.0
    info = [sum(idf[t] for t in set(u.terms)) / math.sqrt(len(set(u.terms)) or 1) for u in units]
    max_info = max(info, default=0.0) or 1.0
    out = []
    for u, vec, inf in zip(units, vectors, info, strict=True):
        centrality = sum(v * centroid.get(t, 0.0) for t, v in vec.items()) / c_norm
        filler = 0.5 if len(set(u.terms)) < 3 else 1.0
        out.append((0.5 * inf / max_info + 0.5 * centrality) * u.weight * filler)
    return out


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def truncate_to_budget(text: str, budget: int, count: Callable[[str], int] = count_tokens) -> str:
    """The longest word prefix of ``text`` within ``budget`` tokens."""
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:  # largest prefix of words that fits
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def extractive_summary(
    previous: str | None,
    messages: Sequence[Message],
    token_budget: int,
    count: Callable[[str], int] = count_tokens,
) -> str:
    """The summary text: at most ``token_budget`` tokens by ``count``; deterministic."""
    if token_budget <= 0:
        return ""
    units = _units(previous, messages)
    if not units:
        return ""
    scores = _scores(units)
    ranked = sorted(range(len(units)), key=lambda i: (-scores[i], i))
    # The previous summary may fill at most part of the budget when there is a new span, so a
    # new version always says something about the new messages; a second pass fills leftovers.
    n_previous = sum(1 for u in units if u.from_previous)
    previous_cap = token_budget if n_previous == len(units) else int(token_budget * _PREVIOUS_SHARE)
    chosen: list[int] = []
    term_sets = [frozenset(u.terms) for u in units]  # once, not per comparison
    used = previous_used = 0
    for capped in (True, False):
        for i in ranked:
            if i in chosen:
                continue
            terms = term_sets[i]
            if any(_jaccard(terms, term_sets[j]) >= _DUPLICATE_JACCARD for j in chosen):
                continue
            cost = count(units[i].text) + (1 if chosen else 0)  # +1 for the joining newline
            if used + cost > token_budget:
                continue
            if capped and units[i].from_previous and previous_used + cost > previous_cap:
                continue
            chosen.append(i)
            used += cost
            previous_used += cost if units[i].from_previous else 0
    chosen.sort()
    text = "\n".join(units[i].text for i in chosen)
    # Token counts of joined text can differ slightly from the sum of parts: enforce exactly.
    while chosen and count(text) > token_budget:
        chosen.remove(min(chosen, key=lambda i: (scores[i], -i)))
        text = "\n".join(units[i].text for i in chosen)
    if not chosen:
        text = truncate_to_budget(units[ranked[0]].text, token_budget, count)
    return text


class ExtractiveSummaryModel:
    """:class:`~memstream.infra.llm.ports.SummaryModel` that needs no network (see module doc)."""

    def __init__(self, count: Callable[[str], int] = count_tokens) -> None:
        self._count = count

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], token_budget: int
    ) -> str:
        return extractive_summary(previous, messages, token_budget, self._count)
