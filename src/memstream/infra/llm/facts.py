"""The offline fact extractor: explicit first-person statements, by rule.

What it can do: find facts a user states plainly in one sentence of their own message --
"my name is ...", "call me ...", "I live in ...", "I work at/for ...", "I prefer ...",
"my favorite X is ...", "remember that ...", "we use ...", "our project/app/stack ..." --
and map each to a category (``user_profile`` / ``project_fact`` / ``observation``), a fixed
importance, and a deterministic key (the same statement always gives the same key, so the
store sees a byte-identical re-store as a no-op and a changed value as a replacement).

What it cannot do: understand anything implied, paraphrased, negated in unusual ways,
spread across sentences, or stated by the assistant; it does not resolve pronouns or
translate. Questions (sentences ending in ``?``) are skipped. Use the OpenAI extractor for
real extraction; this one is a predictable, network-free default.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from memstream.infra.llm.ports import ExtractedFact
from memstream.schemas.limits import MEMORY_KEY_MAX_CHARS
from memstream.schemas.records import Category, Message

_SENTENCE_SPLIT: Final = re.compile(r"(?<=[.!?])\s+|\n+")
# A value runs until punctuation, a clause-joining word, or "and" starting a new clause.
_VALUE: Final = (
    r"(?P<v>[^.,;:!?\n]+?)"
    r"(?=\s+(?:but|so|because|which|who|while)\b"
    r"|\s+and\s+(?:i|i'm|i've|we|we're|my|our|you|it|they|he|she)\b"
    r"|[.,;:!?\n]|$)"
)
# A "remember that" note runs to the end of its sentence.
_NOTE: Final = r"(?P<v>[^\n]+?)[.!]*$"
_MAX_VALUE_CHARS: Final = 300


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    build: Callable[[re.Match[str]], tuple[str, str, Category, float] | None]


def slug(text: str, *, max_words: int = 6, max_chars: int = 60) -> str:
    """A stable key fragment: lowercase words joined by ``-``."""
    words = re.findall(r"[\w]+", text.lower())[:max_words]
    return "-".join(words)[:max_chars].strip("-") or "x"


def _clean(v: str) -> str:
    v = re.sub(r"\s+", " ", v).strip(" \"'`")
    return v[:_MAX_VALUE_CHARS]


def _key(*parts: str) -> str:
    return ".".join(parts)[:MEMORY_KEY_MAX_CHARS]


def _name(m: re.Match[str]) -> tuple[str, str, Category, float] | None:
    v = _clean(m["v"])
    words = v.split()
    if not words or len(words) > 4:
        return None
    return _key("user", "name"), f"The user's name is {v}.", "user_profile", 0.9


def _simple(
    key: str, template: str, category: Category, importance: float
) -> Callable[[re.Match[str]], tuple[str, str, Category, float] | None]:
    def build(m: re.Match[str]) -> tuple[str, str, Category, float] | None:
        v = _clean(m["v"])
        if not v:
            return None
        return _key(key.format(slug=slug(v))), template.format(v=v), category, importance

    return build


def _favorite(m: re.Match[str]) -> tuple[str, str, Category, float] | None:
    thing, v = _clean(m["thing"]), _clean(m["v"])
    if not thing or not v:
        return None
    return (
        _key("user", "favorite", slug(thing)),
        f"The user's favorite {thing} is {v}.",
        "user_profile",
        0.7,
    )


def _note(m: re.Match[str]) -> tuple[str, str, Category, float] | None:
    v = _clean(m["v"])
    if not v:
        return None
    first = v.split()[0].lower()
    category: Category
    if first in {"i", "i'm", "im", "my", "me", "i've", "i'd"}:
        category = "user_profile"
    elif first in {"we", "we're", "our", "us", "the"} and (
        first != "the" or re.match(r"the (project|app|team|repo|codebase|service)\b", v, re.I)
    ):
        category = "project_fact"
    else:
        category = "observation"
    return _key("note", slug(v)), f"The user asked to remember: {v}.", category, 0.8


def _ours(m: re.Match[str]) -> tuple[str, str, Category, float] | None:
    noun, v = m["noun"].lower(), _clean(m["v"])
    if not v:
        return None
    named = re.match(r"(?:is called|is named|'s name is|name is)\s+(?P<n>.+)", v, re.I)
    if named:
        name = _clean(named["n"])
        return (
            _key(noun, "name"),
            f"The user's {noun} is called {name}.",
            "project_fact",
            0.7,
        )
    return _key(noun, slug(v)), f"The user's {noun} {v}.", "project_fact", 0.6


def _rule(
    regex: str, build: Callable[[re.Match[str]], tuple[str, str, Category, float] | None]
) -> _Rule:
    return _Rule(re.compile(regex, re.IGNORECASE), build)


RULES: Final[tuple[_Rule, ...]] = (
    _rule(r"\b(?:my name is|call me)\s+" + _VALUE, _name),
    _rule(
        r"\bi (?:live|am based|'m based) in\s+" + _VALUE,
        _simple("user.location", "The user lives in {v}.", "user_profile", 0.8),
    ),
    _rule(
        r"\bi(?: work|'m working| am working) (?:at|for)\s+" + _VALUE,
        _simple("user.employer", "The user works at {v}.", "user_profile", 0.8),
    ),
    _rule(
        r"\bi (?:really |strongly |generally |usually )?prefer\s+" + _VALUE,
        _simple("user.prefers.{slug}", "The user prefers {v}.", "user_profile", 0.7),
    ),
    _rule(r"\bmy favou?rite (?P<thing>[\w ]{1,30}?) is\s+" + _VALUE, _favorite),
    _rule(r"\b(?:please )?remember that\s+" + _NOTE, _note),
    _rule(
        r"\bwe(?: use|'re using| are using| rely on)\s+" + _VALUE,
        _simple("project.uses.{slug}", "The user's team uses {v}.", "project_fact", 0.6),
    ),
    _rule(
        r"\bour (?P<noun>project|app|application|service|product|stack|codebase|repo|team|company)\s+"
        + _VALUE,
        _ours,
    ),
)


def extract_facts(messages: Sequence[Message]) -> list[ExtractedFact]:
    """Every explicit statement in the user messages, deduplicated by key (the last
    statement of a key wins; facts keep the order of their first mention)."""
    found: dict[str, ExtractedFact] = {}
    for msg in messages:
        if msg.role != "user":
            continue
        for sentence in _SENTENCE_SPLIT.split(msg.content):
            s = sentence.strip()
            if not s or s.endswith("?"):
                continue
            for rule in RULES:
                for m in rule.pattern.finditer(s):
                    built = rule.build(m)
                    if built is None:
                        continue
                    key, content, category, importance = built
                    found[key] = ExtractedFact(key, content, category, importance)
    return list(found.values())


class RuleFactExtractor:
    """:class:`~memstream.infra.llm.ports.FactExtractor` by explicit-statement rules (offline)."""

    async def extract(self, messages: Sequence[Message]) -> list[ExtractedFact]:
        return extract_facts(messages)
