"""The lexical index analyses documents with its own fast path
(:func:`~memstream.projections.messages.lexical_index.document_terms`); it must give the
analyzer's terms exactly, or the index and the queries would disagree on a word."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.projections.analyzer import terms
from memstream.projections.messages import lexical_index
from memstream.projections.messages.lexical_index import document_terms

WORDS = st.sampled_from(
    [
        "Painting",
        "kittens",
        "moves",
        "running",
        "Grüße",
        "München",
        "café",
        "İstanbul",
        "e-mail",
        "a_b",
        "x\x00y",
        "ÀB\u00a0cd",
        "42nd",
        "ties",
        "made",
        "ＦＵＬＬ",
        "🙂ok",
    ]
)
TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(WORDS, max_size=30).map(" ".join),
    st.lists(st.one_of(WORDS, st.text(max_size=5)), max_size=20).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_document_terms_are_the_analyzer_s(text: str) -> None:
    assert document_terms(text) == terms(text)
    assert document_terms(text) == terms(text)  # again, from the stem cache


def test_the_stem_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its bound the cache is emptied before the next miss is stored."""
    monkeypatch.setattr(lexical_index, "_STEMS_MAX", 5)
    monkeypatch.setattr(lexical_index, "_STEMS", {})
    text = " ".join(f"w{i}x" for i in range(40))
    assert document_terms(text) == terms(text)
    assert len(lexical_index._STEMS) == 40  # noqa: SLF001
    assert document_terms("kittens painting") == ["kitten", "paint"]
    assert len(lexical_index._STEMS) == 2  # noqa: SLF001
