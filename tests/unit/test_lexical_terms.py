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


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_the_index_tokenizer_gives_back_a_body_s_terms(text: str) -> None:
    """``body`` is the terms joined by spaces; the index's ``terms`` tokenizer (Tantivy's
    whitespace tokenizer) must give back exactly those terms, in order, whatever the text
    holds (Unicode spaces such as U+00A0, U+2028 or U+3000 stay inside a term, as the
    analyzer keeps them), and the same tokens as the ``[^ ]+`` regex tokenizer it replaced."""
    import tantivy

    body = lexical_index.document_body(text)
    whitespace = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    regex = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(r"[^ ]+")).build()
    assert whitespace.analyze(body) == terms(text) == regex.analyze(body)


@pytest.mark.parametrize("space", ["\u00a0", "\u2028", "\u3000", "\x85", "\u200b", "\ufeff"])
def test_unicode_spaces_stay_inside_a_term(space: str) -> None:
    import tantivy

    text = f"alpha{space}beta gamma"
    whitespace = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    assert whitespace.analyze(lexical_index.document_body(text)) == terms(text)
    assert len(terms(text)) == 2
