"""``journal_message_search``: validation (pure) and the tool (store + summarizer).

The spec's cross-thread transcript search. It reads the ClickHouse projection of the
journal, which holds user and assistant text only (system messages, reasoning and tool
results are never stored there, so never returned). It is a journal tool offered on agent
surfaces (HTTP, Python), never on the MCP gateway, and is independent of the Memory
capability.

Guarantees:

- Results belong to the caller's account and agent; a private thread (one whose messages
  carry a user id) is returned only to its user(s); messages without a user id are visible
  to every caller of the agent.
- A deleted thread is never searched, by anyone, in either scope (``agents_ctx.access``:
  deleted is ``NotFound`` everywhere). Which threads are deleted is read from Postgres, the
  authority (:meth:`~memstream.agents_ctx.access.ThreadAccess.deleted_threads`, cached
  for 2 s per agent), and they are left out inside the search's queries, so ``limit`` hits
  are still returned when that many other messages match. A revived thread is searched
  again.
- A message matches when it shares at least one analysed term with the query (OR, never
  AND: a question's extra words cannot hide its answer) or, when the projection has its
  dense side, when its vector is among the most similar to the query's; results are ranked
  by BM25 with a proximity bonus, fused with dense similarity when there is one, then
  newest first; at most ``limit`` (1-50, default 10). ``explain``
  adds each hit's score and its parts (docs/transcript-search.md, "Matching and ranking").
- With ``summarize`` (default), exactly one utility-model call per distinct matching thread,
  each summarizing that thread's matching messages (in thread order); ``summaries`` lists
  them in the order their threads first appear in the results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol, get_args

import orjson

from memstream.errors import InvalidRequest
from memstream.infra.llm.ports import SummaryModel
from memstream.projections.messages import MessageStore, SearchHit, SearchSpec, query_words
from memstream.projections.messages.sql import MAX_QUERY_WORDS
from memstream.schemas.limits import (
    MAX_QUERY_CHARS,
    SEARCH_DEFAULT_LIMIT,
    SEARCH_MAX_LIMIT,
    SEARCH_MIN_LIMIT,
)
from memstream.schemas.records import Caller, JSONObject, JSONValue, Message, iso
from memstream.schemas.wire import SearchScope

Scope = SearchScope
SCOPES: Final = get_args(SearchScope)
SUMMARY_TOKEN_BUDGET: Final = 200
"""Tokens per thread summary: a few lines an agent can read without flooding its context."""


def build_search_spec(
    caller: Caller,
    query: object,
    scope: object = "all_threads",
    thread_id: object = None,
    limit: object = SEARCH_DEFAULT_LIMIT,
    explain: object = False,
) -> SearchSpec:
    """Validate the tool's arguments; every error names its field."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidRequest("query must be a non-empty string", field="query")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"query must be at most {MAX_QUERY_CHARS} characters", field="query")
    words = query_words(query)
    if not words:
        raise InvalidRequest("query must contain at least one letter or digit", field="query")
    if len(words) > MAX_QUERY_WORDS:
        raise InvalidRequest(f"query must have at most {MAX_QUERY_WORDS} words", field="query")
    if scope not in SCOPES:
        raise InvalidRequest("scope must be all_threads or current_thread", field="scope")
    if not isinstance(explain, bool):
        raise InvalidRequest("explain must be a boolean", field="explain")
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise InvalidRequest("limit must be an integer", field="limit")
    if not SEARCH_MIN_LIMIT <= limit <= SEARCH_MAX_LIMIT:
        raise InvalidRequest(
            f"limit must be between {SEARCH_MIN_LIMIT} and {SEARCH_MAX_LIMIT}", field="limit"
        )
    scoped_thread: str | None = None
    if scope == "current_thread":
        if not isinstance(thread_id, str) or not thread_id:
            raise InvalidRequest("scope current_thread needs a thread_id", field="thread_id")
        scoped_thread = thread_id
    elif thread_id is not None and not isinstance(thread_id, str):
        raise InvalidRequest("thread_id must be a string", field="thread_id")
    return SearchSpec(
        account_id=caller.account_id,
        agent_id=caller.agent_id,
        user_id=caller.user_id,
        words=words,
        limit=limit,
        thread_id=scoped_thread,
        explain=explain,
        text=query,
    )


class DeletedThreads(Protocol):
    """Where the deleted threads are read (``agents_ctx.access.ThreadAccess``)."""

    async def deleted_threads(self, caller: Caller) -> frozenset[str]: ...


class NoDeletedThreads:
    """A source of deleted threads with none (a store without thread records: benches,
    tests of the projection alone)."""

    async def deleted_threads(self, caller: Caller) -> frozenset[str]:
        return frozenset()


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    thread_id: str
    content: str


@dataclass(frozen=True, slots=True)
class SearchResult:
    results: list[SearchHit]
    summaries: list[ThreadSummary]

    def to_dict(self) -> JSONObject:
        """The HTTP answer: ``{"results": [...], "summaries": [...]}``."""
        return {
            "results": [
                {
                    "thread_id": h.thread_id,
                    "message_id": h.message_id,
                    "offset": h.offset,
                    "role": h.role,
                    "content": h.content,
                    "created_at": iso(h.created_at),
                    **(
                        {"score": round(h.relevance, 6), "explain": _json(h.explain)}
                        if h.explain is not None
                        else {}
                    ),
                }
                for h in self.results
            ],
            "summaries": [{"thread_id": s.thread_id, "content": s.content} for s in self.summaries],
        }


def _json(value: object) -> JSONValue:
    """Score parts as JSON (they are built of str, int, float and dicts of them)."""
    return orjson.loads(orjson.dumps(value))  # type: ignore[no-any-return]


def hits_by_thread(caller: Caller, hits: Sequence[SearchHit]) -> dict[str, list[Message]]:
    """Group hits per thread (threads in first-appearance order, messages by offset)."""
    grouped: dict[str, list[Message]] = {}
    for h in hits:
        grouped.setdefault(h.thread_id, []).append(
            Message(
                account_id=caller.account_id,
                agent_id=caller.agent_id,
                thread_id=h.thread_id,
                offset=h.offset,
                message_id=h.message_id,
                role="assistant" if h.role == "assistant" else "user",
                content=h.content,
                created_at=h.created_at,
            )
        )
    for msgs in grouped.values():
        msgs.sort(key=lambda m: m.offset)
    return grouped


async def journal_message_search(
    caller: Caller,
    query: object,
    scope: object = "all_threads",
    thread_id: object = None,
    limit: object = SEARCH_DEFAULT_LIMIT,
    summarize: object = True,
    explain: object = False,
    *,
    store: MessageStore,
    summarizer: SummaryModel,
    threads: DeletedThreads,
    every_user: bool = False,
) -> SearchResult:
    """Search the caller's transcripts. See the module docstring for the guarantees.
    ``every_user``: the operator console's search, over every user's threads (never set
    from an agent surface)."""
    spec = build_search_spec(caller, query, scope, thread_id, limit, explain)
    if every_user:
        spec = replace(spec, every_user=True)
    if not isinstance(summarize, bool):
        raise InvalidRequest("summarize must be a boolean", field="summarize")
    deleted = await threads.deleted_threads(caller)
    if spec.thread_id is not None:
        if spec.thread_id in deleted:  # as for someone else's thread: nothing to find
            return SearchResult(results=[], summaries=[])
    elif deleted:
        spec = replace(spec, excluded_threads=tuple(sorted(deleted)))
    hits = await store.search(spec)
    if not summarize or not hits:
        return SearchResult(results=hits, summaries=[])
    grouped = hits_by_thread(caller, hits)
    contents = await asyncio.gather(
        *(summarizer.summarize(None, msgs, SUMMARY_TOKEN_BUDGET) for msgs in grouped.values())
    )
    return SearchResult(
        results=hits,
        summaries=[
            ThreadSummary(thread_id=t, content=c) for t, c in zip(grouped, contents, strict=True)
        ],
    )
