"""Model providers for thread memory: summaries and fact extraction.

Two ports, each with an offline default (no network, deterministic) and an OpenAI
implementation (the ``openai`` package against any OpenAI-compatible endpoint):

- :class:`SummaryModel` -- ``summarize(previous, messages, token_budget)`` folds new messages
  into the previous summary (progressive summarization). Also usable for any "summarize these
  messages" job (transcript search's per-thread summaries): pass ``previous=None``.
- :class:`FactExtractor` -- ``extract(messages)`` returns durable facts
  (:class:`ExtractedFact`) for the pre-compaction flush.

:func:`build_models` picks the implementation from :class:`~memstream.infra.settings.Settings`
(``llm_provider``). What the offline providers can and cannot do is stated in their modules
and in ``docs/thread-memory.md``.
"""

from __future__ import annotations

from memstream.infra.llm.facts import RuleFactExtractor
from memstream.infra.llm.openai_models import OpenAIFactExtractor, OpenAISummaryModel
from memstream.infra.llm.ports import ExtractedFact, FactExtractor, SummaryModel, render_message
from memstream.infra.llm.summary import ExtractiveSummaryModel
from memstream.infra.settings import Settings

__all__ = [
    "ExtractedFact",
    "ExtractiveSummaryModel",
    "FactExtractor",
    "OpenAIFactExtractor",
    "OpenAISummaryModel",
    "RuleFactExtractor",
    "SummaryModel",
    "build_models",
    "render_message",
]


def build_models(settings: Settings) -> tuple[SummaryModel, FactExtractor]:
    """The summary model and fact extractor the settings ask for (offline by default)."""
    if settings.llm_provider == "openai":
        from openai import AsyncOpenAI  # noqa: PLC0415 - only needed on this path

        # explicit bounds: the SDK's defaults (600 s per attempt, 2 retries) could outlive
        # the summary lock; the processor's dispatcher retries a failed job anyway
        client = AsyncOpenAI(
            api_key=settings.openai_api_key.get_secret_value() or "unset",
            base_url=settings.openai_base_url or None,
            timeout=settings.openai_timeout_s,
            max_retries=settings.openai_max_retries,
        )
        model = settings.openai_chat_model
        return OpenAISummaryModel(client, model), OpenAIFactExtractor(client, model)
    return ExtractiveSummaryModel(), RuleFactExtractor()
