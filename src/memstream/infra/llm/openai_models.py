"""The OpenAI providers: summaries and fact extraction through chat completions.

Works with any OpenAI-compatible endpoint (``openai_base_url``). Guarantees on top of the
model's answer: a summary is cut to ``token_budget`` tokens (by whole lines, then words) if the
model overshoots; extracted facts are validated (category from the spec's three, importance
clamped to ``[0, 1]``, key shortened to the maximum) and malformed ones dropped. Transport
failures become :class:`~memstream.errors.RetryableInfraError` (connection, timeout, 429, 5xx)
or :class:`~memstream.errors.PermanentInfraError` (any other API error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final, cast

import openai
import orjson
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from memstream.errors import PermanentInfraError, RetryableInfraError
from memstream.infra.llm.facts import slug
from memstream.infra.llm.ports import ExtractedFact, render_message
from memstream.infra.llm.summary import truncate_to_budget
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.limits import IMPORTANCE_DEFAULT, MEMORY_KEY_MAX_CHARS
from memstream.schemas.records import CATEGORIES, Category, Message

log = logging.getLogger(__name__)

SUMMARY_SYSTEM_PROMPT: Final = (
    "You maintain a rolling summary of a conversation between a user and an AI agent. "
    "You are given the previous summary (if any) and the messages that came after it. "
    "Write an updated summary that keeps every durable fact, decision, preference and open "
    "task from the previous summary unless the new messages contradict it, and adds what "
    "matters from the new messages. Be concise and factual; no preamble. "
    "Stay within {budget} tokens."
)

FACTS_SYSTEM_PROMPT: Final = (
    "You extract durable facts worth remembering across conversations from the messages "
    "you are given (they are about to be compressed). Only facts stated or confirmed by the "
    "user: their profile and preferences (category user_profile), facts about their project "
    "(project_fact), or other lasting observations (observation). Answer with JSON only: "
    '{"facts": [{"key": "short.stable.key", "content": "one sentence", "category": '
    '"user_profile|project_fact|observation", "importance": 0.0-1.0}]}. '
    'Answer {"facts": []} when there is nothing durable.'
)


def _transcript(messages: Sequence[Message]) -> str:
    return "\n".join(render_message(m) for m in messages)


def _translate(e: openai.OpenAIError) -> Exception:
    retryable = isinstance(
        e,
        openai.APIConnectionError | openai.RateLimitError | openai.InternalServerError,
    )
    cls = RetryableInfraError if retryable else PermanentInfraError
    return cls(f"OpenAI request failed: {e}")


def fit_budget(text: str, budget: int, count: Callable[[str], int] = count_tokens) -> str:
    """``text`` cut to ``budget`` tokens: whole lines first, then words of the last line."""
    text = text.strip()
    if count(text) <= budget:
        return text
    kept: list[str] = []
    for line in text.splitlines():
        trial = "\n".join([*kept, line])
        if count(trial) > budget:
            rest = budget - (count("\n".join(kept)) + 1 if kept else 0)
            part = truncate_to_budget(line, rest, count) if rest > 0 else ""
            if part:
                kept.append(part)
            break
        kept.append(line)
    out = "\n".join(kept)
    while out and count(out) > budget:  # joining can shift token boundaries by one
        out = out.rsplit(maxsplit=1)[0] if " " in out or "\n" in out else ""
    return out


class OpenAISummaryModel:
    """:class:`~memstream.infra.llm.ports.SummaryModel` via ``chat.completions``.

    The request carries the previous summary and the new messages in one user message, and
    asks for at most ``token_budget`` tokens (``max_completion_tokens``).
    """

    def __init__(self, client: AsyncOpenAI, model: str, *, temperature: float = 0.2) -> None:
        self._client = client
        self._model = model
        self._temperature = temperature

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], token_budget: int
    ) -> str:
        if token_budget <= 0:
            return ""
        user = (
            f"Previous summary:\n{previous if previous else '(none)'}\n\n"
            f"New messages:\n{_transcript(messages)}\n\n"
            "Write the updated summary."
        )
        request: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SUMMARY_SYSTEM_PROMPT.format(budget=token_budget)},
            {"role": "user", "content": user},
        ]
        try:
            resp = await self._client.chat.completions.create(
                model=self._model,
                messages=request,
                max_completion_tokens=token_budget,
                temperature=self._temperature,
            )
        except openai.OpenAIError as e:
            raise _translate(e) from e
        content = resp.choices[0].message.content if resp.choices else None
        return fit_budget(content or "", token_budget)


def parse_facts(raw: str) -> list[ExtractedFact]:
    """Facts from the model's JSON answer; malformed items are dropped (logged)."""
    text = raw.strip()
    if text.startswith("```"):  # tolerate a fenced answer
        text = text.strip("`").removeprefix("json").strip()
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        log.warning("fact extraction answer is not JSON; no facts taken")
        return []
    items = doc.get("facts") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        return []
    out: dict[str, ExtractedFact] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        category = item.get("category")
        if not isinstance(content, str) or not content.strip() or category not in CATEGORIES:
            continue
        key = item.get("key")
        key = key.strip() if isinstance(key, str) and key.strip() else slug(content)
        imp = item.get("importance", IMPORTANCE_DEFAULT)
        importance = (
            float(imp)
            if isinstance(imp, int | float) and not isinstance(imp, bool)
            else IMPORTANCE_DEFAULT
        )
        cat = cast(Category, category)  # checked against CATEGORIES
        out[key[:MEMORY_KEY_MAX_CHARS]] = ExtractedFact(
            key=key[:MEMORY_KEY_MAX_CHARS],
            content=content.strip(),
            category=cat,
            importance=min(1.0, max(0.0, importance)),
        )
    return list(out.values())


class OpenAIFactExtractor:
    """:class:`~memstream.infra.llm.ports.FactExtractor` via one silent ``chat.completions`` turn."""

    def __init__(self, client: AsyncOpenAI, model: str) -> None:
        self._client = client
        self._model = model

    async def extract(self, messages: Sequence[Message]) -> list[ExtractedFact]:
        if not messages:
            return []
        request: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": FACTS_SYSTEM_PROMPT},
            {"role": "user", "content": _transcript(messages)},
        ]
        try:
            resp = await self._client.chat.completions.create(
                model=self._model,
                messages=request,
                response_format={"type": "json_object"},
                temperature=0,
            )
        except openai.OpenAIError as e:
            raise _translate(e) from e
        content = resp.choices[0].message.content if resp.choices else None
        return parse_facts(content or "")
