"""Threshold rules for thread summaries (pure: no I/O).

A thread is summarized when its unsummarized span reaches
:data:`~memstream.schemas.limits.SUMMARY_TOKEN_THRESHOLD` tokens (2,000) or
:data:`~memstream.schemas.limits.SUMMARY_MESSAGE_THRESHOLD` messages (50), whichever comes
first: 49 messages of a few tokens ask for nothing, the 50th asks for a summary.

The counters processor keeps these counters in Redis (atomically, with a per-message claim);
these functions are the rule it applies. After a summary of a span is written the span's
totals are subtracted (:func:`after_summary`), not zeroed, so messages counted while the
summary was being written stay counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.schemas.limits import SUMMARY_MESSAGE_THRESHOLD, SUMMARY_TOKEN_THRESHOLD


@dataclass(frozen=True, slots=True)
class ThresholdCounters:
    """Tokens and messages since the last summary (the spec's two threshold counters)."""

    tokens: int = 0
    messages: int = 0


def should_summarize(c: ThresholdCounters) -> bool:
    """True when the unsummarized span has reached either threshold."""
    return c.tokens >= SUMMARY_TOKEN_THRESHOLD or c.messages >= SUMMARY_MESSAGE_THRESHOLD


def count_message(c: ThresholdCounters, message_tokens: int) -> ThresholdCounters:
    """The counters after one more message of ``message_tokens`` tokens."""
    return ThresholdCounters(c.tokens + max(0, message_tokens), c.messages + 1)


def step(c: ThresholdCounters, message_tokens: int) -> tuple[ThresholdCounters, bool]:
    """Count one message; say whether the thread now needs a summary."""
    new = count_message(c, message_tokens)
    return new, should_summarize(new)


def after_summary(
    c: ThresholdCounters, summarized_tokens: int, summarized_messages: int
) -> ThresholdCounters:
    """The counters once a summary covering a span of this size is written (never negative)."""
    return ThresholdCounters(
        max(0, c.tokens - summarized_tokens), max(0, c.messages - summarized_messages)
    )


def span_start(up_to_offset: int, messages: int) -> int:
    """First offset of an unsummarized span of ``messages`` messages ending at ``up_to_offset``
    (per-thread offsets are dense)."""
    return max(0, up_to_offset - messages + 1)
