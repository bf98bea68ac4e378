"""The text analyzer shared by transcript search and memory recall's BM25 (pure).

One analysis, two implementations that agree exactly: :func:`terms` in Python (the query
side of both searches, and the document side of memory recall) and :func:`terms_sql` in
ClickHouse SQL (the document side of transcript search, a ``MATERIALIZED`` column computed
by ClickHouse at insert, so the projector's bulk path stays in ClickHouse). A unit test runs
both over the same vocabulary.

Steps:

1. Tokens: ClickHouse's ``splitByNonAlpha`` (every ASCII byte that is not a letter or digit
   separates; every non-ASCII character belongs to a token), lowercased (``str.lower``
   agrees with ``lowerUTF8``).
2. A light English stemmer (chdb ships no ``stem()`` and a Python stemmer would have to run
   per message in the projector): plural ``-s``/``-es``/``-ies``, ``-ed``/``-ing`` with a
   vowel left in the stem (and a doubled final consonant undone: running -> run), then a
   final silent ``e`` (make, making -> mak). Only all-ASCII-letter tokens are stemmed; words
   with digits or non-ASCII letters are kept as they are.
3. Queries only: English stop words are dropped (on the unstemmed token), unless the query
   has nothing else (then every token counts, so "who is it" still searches).
"""

from __future__ import annotations

import re
from typing import Final

_SEPARATORS: Final = re.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")

STOP_WORDS: Final = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing done down during each few for
    from further had has have having he her here hers herself him himself his how i if in into
    is it its itself just me more most my myself no nor not now of off on once only or other
    our ours ourselves out over own same she should so some such than that the their theirs
    them themselves then there these they this those through to too under until up very was
    we were what when where which while who whom why will with would you your yours yourself
    yourselves s t d ll m re ve don didn doesn isn wasn weren haven hasn hadn won wouldn shan
    shouldn couldn mustn let us also ever tell""".split()  # noqa: SIM905
)
"""Function words a question carries but its evidence need not ("When did Caroline go to
...")."""

# Each stemming step as (pattern, action) pairs, first match wins; the SQL and the Python
# implementations are generated from these same tables.
_STEM: Final = "([a-z]{2,}[aeiouy][a-z]*|[a-z]?[aeiouy][a-z]{2,}|[a-z][aeiouy][a-z]+)"
"""At least three letters, one of them a vowel: what ``-ed``/``-ing`` may leave."""
_DOUBLE: Final = "(bb|dd|ff|gg|mm|nn|pp|rr|tt)$"
_PLURAL: Final = (
    ("^[a-z]*sses$", "cut2"),
    ("^[a-z]{2,}ies$", "ies"),
    ("^[a-z]*(ss|us|is)$", "keep"),
    ("^[a-z]{3,}s$", "cut1"),
)
_SUFFIX: Final = (
    ("^[a-z]{2,}ied$", "ies"),
    ("^[a-z]*eed$", "keep"),
    (f"^{_STEM}ing$", "ing"),
    (f"^{_STEM}ed$", "ed"),
)
_FINAL_E: Final = (("^[a-z]{2,}[a-df-z]e$", "cut1"),)


_COMPILED: Final[dict[str, re.Pattern[str]]] = {
    p: re.compile(p) for rules in (_PLURAL, _SUFFIX, _FINAL_E) for p, _ in rules
}
_DOUBLE_RE: Final = re.compile(_DOUBLE)


def _undouble(s: str) -> str:
    return s[:-1] if _DOUBLE_RE.search(s) else s


def _apply(w: str, rules: tuple[tuple[str, str], ...]) -> str:
    for pattern, action in rules:
        if _COMPILED[pattern].fullmatch(w):
            if action == "keep":
                return w
            if action == "cut1":
                return w[:-1]
            if action == "cut2":
                return w[:-2]
            if action == "ies":
                return w[:-3] + "y"
            if action == "ing":
                return _undouble(w[:-3])
            return _undouble(w[:-2])  # "ed"
    return w


def stem(token: str) -> str:
    """The light English stem of one lowercased token (see the module docstring)."""
    if not (token.isascii() and token.isalpha()):  # no rule matches anything but [a-z]
        return token
    return _apply(_apply(_apply(token, _PLURAL), _SUFFIX), _FINAL_E)


def tokens(text: str) -> list[str]:
    """``splitByNonAlpha`` tokens of ``text``, lowercased, in order (duplicates kept)."""
    return [w for w in _SEPARATORS.split(text.lower()) if w]


def terms(text: str) -> list[str]:
    """Document terms: every token, stemmed, in order (what ``terms_sql`` computes)."""
    return [stem(w) for w in tokens(text)]


def query_terms(query: str) -> tuple[str, ...]:
    """The distinct stemmed terms of a query in first-appearance order, stop words dropped
    unless nothing else is left."""
    toks = tokens(query)
    content = [w for w in toks if w not in STOP_WORDS] or toks
    return tuple(dict.fromkeys(stem(w) for w in content))


# --- The same analysis in ClickHouse SQL -----------------------------------------------------


def _sql_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_action(action: str, w: str) -> str:
    def cut(n: int) -> str:
        return f"substring({w}, 1, length({w}) - {n})"

    def undouble(x: str) -> str:
        return f"if(match({x}, {_sql_str(_DOUBLE)}), substring({x}, 1, length({x}) - 1), {x})"

    return {
        "keep": w,
        "cut1": cut(1),
        "cut2": cut(2),
        "ies": f"concat({cut(3)}, 'y')",
        "ing": undouble(cut(3)),
        "ed": undouble(cut(2)),
    }[action]


def _sql_step(rules: tuple[tuple[str, str], ...], w: str) -> str:
    arms = ", ".join(f"match({w}, {_sql_str(p)}), {_sql_action(a, w)}" for p, a in rules)
    return f"multiIf({arms}, {w})"


def terms_sql(text: str) -> str:
    """A ClickHouse expression for :func:`terms` of the String expression ``text``."""
    arr = f"tokens(lowerUTF8({text}), 'splitByNonAlpha')"
    for rules in (_PLURAL, _SUFFIX, _FINAL_E):
        arr = f"arrayMap(w -> {_sql_step(rules, 'w')}, {arr})"
    return arr
