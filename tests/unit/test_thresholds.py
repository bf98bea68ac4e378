"""The threshold rule: 2,000 tokens or 50 messages, whichever comes first."""

from memstream.schemas.limits import SUMMARY_MESSAGE_THRESHOLD, SUMMARY_TOKEN_THRESHOLD
from memstream.streams.thresholds import (
    ThresholdCounters,
    after_summary,
    should_summarize,
    span_start,
    step,
)


def run(messages: list[int]) -> list[bool]:
    c = ThresholdCounters()
    out = []
    for tokens in messages:
        c, ask = step(c, tokens)
        out.append(ask)
    return out


def test_spec_numbers() -> None:
    assert SUMMARY_TOKEN_THRESHOLD == 2_000
    assert SUMMARY_MESSAGE_THRESHOLD == 50


def test_49_messages_ask_nothing_the_50th_asks() -> None:
    asks = run([5] * 50)
    assert not any(asks[:49])
    assert asks[49]


def test_tokens_cross_before_the_message_count() -> None:
    asks = run([600, 600, 600, 199, 1])
    assert asks == [False, False, False, False, True]


def test_one_huge_message_crosses_alone() -> None:
    assert run([5_000]) == [True]


def test_after_summary_subtracts_the_span_and_keeps_later_messages() -> None:
    c = ThresholdCounters(tokens=2_300, messages=53)
    left = after_summary(c, summarized_tokens=2_000, summarized_messages=50)
    assert left == ThresholdCounters(tokens=300, messages=3)
    assert not should_summarize(left)


def test_after_summary_never_goes_negative() -> None:
    assert after_summary(ThresholdCounters(10, 2), 500, 50) == ThresholdCounters(0, 0)


def test_span_start() -> None:
    assert span_start(49, 50) == 0
    assert span_start(120, 20) == 101
