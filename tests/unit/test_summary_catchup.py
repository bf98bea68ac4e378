"""What a stored summary covers that Valkey's watermark lost (the pure rule of the catch-up)."""

from __future__ import annotations

from memstream.streams.summary_catchup import lost_span


def test_a_summary_newer_than_the_watermark_is_the_span_between_them() -> None:
    assert lost_span(-1, 39) == (0, 39)
    assert lost_span(19, 39) == (20, 39)


def test_nothing_is_lost_when_valkey_holds_the_summary_or_knows_nothing() -> None:
    assert lost_span(39, 39) is None
    assert lost_span(49, 39) is None  # a summary applied the store does not show yet
    assert lost_span(10, None) is None
    assert lost_span(None, 39) is None  # unknown: loaded from the store on first sight
