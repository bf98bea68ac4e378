"""The two model ports of thread memory and the record they exchange.

Guarantees every implementation gives:

- ``SummaryModel.summarize`` returns text whose token count (``count_tokens``, the one
  encoding) is at most ``token_budget``, and includes what matters of ``previous``.
- ``FactExtractor.extract`` returns facts with a category from the spec's three, an
  importance in ``[0, 1]`` and a non-empty key of at most ``MEMORY_KEY_MAX_CHARS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from memstream.schemas.records import Category, Message


@dataclass(frozen=True, slots=True)
class ExtractedFact:
    """One durable fact pulled from a conversation span, ready for ``memory_store``."""

    key: str
    content: str
    category: Category
    importance: float


class SummaryModel(Protocol):
    async def summarize(
        self, previous: str | None, messages: Sequence[Message], token_budget: int
    ) -> str:
        """Fold ``messages`` into ``previous`` (None for a first summary) within the budget."""
        ...


class FactExtractor(Protocol):
    async def extract(self, messages: Sequence[Message]) -> list[ExtractedFact]:
        """Durable facts stated in ``messages`` (possibly none)."""
        ...


ROLE_LABELS: dict[str, str] = {
    "system": "System",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
}


def render_message(msg: Message) -> str:
    """One message as a transcript line (``User: ...``); tool calls are named, not dumped."""
    label = ROLE_LABELS.get(msg.role, msg.role)
    text = msg.content.strip()
    if msg.tool_calls:
        names = ", ".join(tc.name for tc in msg.tool_calls)
        text = f"{text} [called tools: {names}]".strip()
    return f"{label}: {text}"
