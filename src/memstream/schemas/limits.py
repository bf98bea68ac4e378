"""The spec's numbers, as named constants. Every rule imports its number from here.

These are platform values: none is configurable per account or agent (the spec says so for
the window cap and the pinning numbers; we hold the rest to the same standard).
"""

from __future__ import annotations

from typing import Final

# --- thread memory -------------------------------------------------------------------------
WINDOW_MESSAGES: Final = 20
"""Recent-window cap. A thread's ``max_working_memory_messages`` may lower it, never raise it."""

SUMMARY_TOKEN_THRESHOLD: Final = 2_000
"""A thread whose unsummarized span reaches this many tokens is summarized."""

SUMMARY_MESSAGE_THRESHOLD: Final = 50
"""... or this many messages, whichever comes first."""

SUMMARY_CACHE_TTL_SECONDS: Final = 3_600
"""Redis caches a thread's summary for one hour."""

SUMMARY_LOCK_TTL_SECONDS: Final = 120
"""A summarization lock expires so a crashed holder cannot block a thread forever."""

TOKEN_ENCODING: Final = "cl100k_base"  # noqa: S105 - an encoding name
"""The one tokenizer encoding used for every token count."""

# --- agent memory --------------------------------------------------------------------------
IMPORTANCE_DEFAULT: Final = 0.5
IMPORTANCE_MIN: Final = 0.0
IMPORTANCE_MAX: Final = 1.0

PIN_MIN_IMPORTANCE: Final = 0.7
PIN_MAX_ENTRIES: Final = 10

RECALL_DEFAULT_LIMIT: Final = 5
RECALL_MAX_LIMIT: Final = 20
RECALL_BOOST_BASE: Final = 0.8
RECALL_BOOST_PER_IMPORTANCE: Final = 0.2
"""Recall ranking: ``score * (0.8 + importance * 0.2)``."""

EMBEDDING_MODEL_OPENAI: Final = "text-embedding-3-small"
EMBEDDING_DIMENSIONS_OPENAI: Final = 1_536
EMBEDDING_MAX_TOKENS_OPENAI: Final = 8_191
"""Tokens ``text-embedding-3-small`` reads of one input; a longer input is cut to this."""
EMBEDDING_MAX_REQUEST_TOKENS_OPENAI: Final = 300_000
"""Tokens the OpenAI embeddings endpoint takes in one request, summed over its inputs."""

OBSERVATION_TTL_DAYS: Final = 30
DECAY_AFTER_DAYS: Final = 90
DECAY_STEP: Final = 0.1
DECAY_FLOOR: Final = 0.1

MEMORY_KEY_MAX_CHARS: Final = 200


class CategoryLimits:
    """Capacity per agent and per user, and the maximum content length, per category."""

    __slots__ = ("max_content_chars", "per_agent", "per_user")

    def __init__(self, per_agent: int, per_user: int, max_content_chars: int) -> None:
        self.per_agent = per_agent
        self.per_user = per_user
        self.max_content_chars = max_content_chars


CATEGORY_LIMITS: Final[dict[str, CategoryLimits]] = {
    "user_profile": CategoryLimits(per_agent=100, per_user=30, max_content_chars=2_000),
    "project_fact": CategoryLimits(per_agent=200, per_user=50, max_content_chars=4_000),
    "observation": CategoryLimits(per_agent=500, per_user=100, max_content_chars=2_000),
}

# --- journal tools -------------------------------------------------------------------------
SEARCH_DEFAULT_LIMIT: Final = 10
SEARCH_MIN_LIMIT: Final = 1
SEARCH_MAX_LIMIT: Final = 50
MAX_QUERY_CHARS: Final = 2_000
"""The longest query, in characters, of ``journal_message_search`` and of memory recall."""
TOOL_VIEW_MAX_BYTES: Final = 32_768

# --- surfaces ------------------------------------------------------------------------------
MAX_MESSAGE_CONTENT_CHARS: Final = 1_000_000
MAX_MESSAGES_PER_APPEND: Final = 1_000
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
MAX_JSON_DEPTH: Final = 32
"""Deepest nesting of a JSON body or of a tool call's ``arguments`` (objects and arrays)."""

# --- the bus ---------------------------------------------------------------------------------
MAX_BUS_RECORD_BYTES: Final = 1_000_000
"""Largest journal record (key + encoded envelope) the bus carries. Kafka refuses records over
``message.max.bytes`` (1 MiB + 12 by default) and the producer requests over 1 MiB; this
leaves room for the batch and record headers. An append whose message would encode larger is
refused at the edge (field ``messages[i].content``); a larger record found in the journal
anyway is quarantined by the relay (dead letter, alert) instead of stopping it."""
