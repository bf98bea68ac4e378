"""The HTTP wire shapes, as pydantic models: the one schema per record the OpenAPI contract
(``/openapi.json``, ``/docs``) is generated from.

These models document; they do not sit on the hot path. Routes still parse bodies with
``agents_ctx.validation`` (so every refusal is a 400 naming the exact field) and answer
with the records' own ``to_dict()`` through orjson. What keeps the two from drifting:
the lists a route checks (roles, categories, visibilities, search scopes) are the ones these
models show (``records.Role``, ``Category``, ``Visibility``, :data:`SearchScope`);
``tests/unit/test_wire_schemas.py`` checks each record's ``to_dict()`` keys against its model,
and ``tests/integration/test_openapi_contract.py`` validates real answers of every route
against ``/openapi.json``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from memstream.schemas.records import Category, Role, Visibility

# --- errors ------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. invalid_request")
    message: str
    field: str | None = Field(
        default=None, description="the refused field, dotted path (messages[2].tool_calls[0].id)"
    )
    position: int | None = Field(default=None, description="not_ready only: the position awaited")


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail


# --- messages ----------------------------------------------------------------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="JSON text, as OpenAI sends it")


class OpenAIToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FlatToolCall(BaseModel):
    """memstream's original flat shape, still accepted on append."""

    id: str
    name: str
    arguments: Any = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class MessageIn(BaseModel):
    """One message to append: the OpenAI Chat Completions shape (or the flat tool-call shape).
    ``developer`` is stored as ``system``."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[OpenAIToolCall | FlatToolCall] | None = None
    tool_call_id: str | None = Field(default=None, description="tool messages: the call answered")
    reasoning: str | None = None


class AppendBody(BaseModel):
    """Several messages at once (or send one message object as the whole body)."""

    messages: list[MessageIn] = Field(min_length=1)


class ContextMessage(BaseModel):
    """A context message in the OpenAI Chat Completions shape."""

    role: Role
    content: str | None
    tool_calls: list[OpenAIToolCall] | None = None
    tool_call_id: str | None = None


# --- records -----------------------------------------------------------------------------------


class Summary(BaseModel):
    """``records.Summary.to_dict()``: the spec's seven fields."""

    version: int
    timestamp: str
    last_message_offset: int
    last_message_id: str
    content: str
    token_count: int
    message_count: int


class MemoryEntry(BaseModel):
    """``records.MemoryEntry.to_dict()``: an entry as the API shows it."""

    key: str
    content: str
    category: Category
    visibility: Visibility
    importance: float
    user_id: str | None
    content_hash: str
    expires_at: str | None
    created_at: str
    updated_at: str
    recall_count: int
    last_recalled_at: str | None


class ScoredEntry(MemoryEntry):
    score: float


# --- request bodies ----------------------------------------------------------------------------


class AgentBody(BaseModel):
    memory: bool = Field(description="bind the Memory capability")


class ThreadConfigBody(BaseModel):
    max_working_memory_messages: int | None = Field(default=None, ge=0)


class ThreadMetadataBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    config: ThreadConfigBody | None = None


class ThreadBody(BaseModel):
    thread_id: str | None = Field(default=None, description="generated when absent")
    metadata: ThreadMetadataBody | None = None


class StoreBody(BaseModel):
    key: str
    content: str
    category: Category
    scope: Visibility
    importance: float | None = Field(default=None, ge=0, le=1)


class RecallBody(BaseModel):
    query: str
    limit: int | None = None
    category: Category | None = None
    after: int | None = Field(default=None, description="read-your-writes: a store's position")


class ForgetBody(BaseModel):
    key: str


SearchScope = Literal["all_threads", "current_thread"]
"""Where ``journal_message_search`` looks (the one list: the route checks it, the OpenAPI
document shows it)."""


class SearchBody(BaseModel):
    query: str
    scope: SearchScope = "all_threads"
    thread_id: str | None = None
    limit: int | None = None
    summarize: bool = True
    explain: bool = Field(default=False, description="return each hit's score and its parts")
    after: int | None = Field(default=None, description="read-your-writes: an append's position")


class AdminAppendBody(BaseModel):
    account_id: str
    agent_id: str
    thread_id: str
    user_id: str | None = None
    messages: list[MessageIn] = Field(min_length=1)


# --- answers -----------------------------------------------------------------------------------


class Agent(BaseModel):
    agent_id: str
    memory: bool


class Thread(BaseModel):
    thread_id: str
    metadata: dict[str, Any]
    shared: bool = Field(
        description="True for a thread opened without a user: every caller of the agent may "
        "read and append to it. False: it is the calling user's alone."
    )


class AppendedMessage(BaseModel):
    offset: int
    message_id: str


class Appended(BaseModel):
    appended: list[AppendedMessage]
    position: int | None = Field(
        default=None, description="read-your-writes: pass as 'after' to search"
    )


class Recap(BaseModel):
    """A digest of the thread's messages ``first_offset``..``last_offset``: after the summary,
    before the window. ``message_count`` of them were read (the newest); ``left_out`` older
    ones were not."""

    first_offset: int
    last_offset: int
    message_count: int
    left_out: int
    content: str


class Context(BaseModel):
    """``GET .../context``. With ``?format=anthropic`` ``messages`` are Anthropic Messages
    turns (content blocks) and ``system`` holds the system text."""

    messages: list[ContextMessage] | list[dict[str, Any]]
    system: str | None = None
    pinned: list[MemoryEntry]
    summary: Summary | None
    window: int
    recap: Recap | None = Field(
        default=None, description="with ?recap=true: the messages in neither summary nor window"
    )


class Stored(BaseModel):
    status: Literal["created", "unchanged", "replaced"]
    entry: MemoryEntry
    position: int = Field(description="read-your-writes: pass as 'after' to recall")


class Recalled(BaseModel):
    results: list[ScoredEntry]
    source: Literal["index", "fallback"]


class Forgotten(BaseModel):
    forgotten: bool


class SearchHit(BaseModel):
    thread_id: str
    message_id: str
    offset: int
    role: str
    content: str
    created_at: str | None
    score: float | None = Field(default=None, description="with explain: the relevance")
    explain: dict[str, Any] | None = Field(
        default=None,
        description="with explain: bm25, proximity, per-term tf/df, length, average_length, messages",
    )


class ThreadSummaryText(BaseModel):
    thread_id: str
    content: str


class SearchResult(BaseModel):
    results: list[SearchHit]
    summaries: list[ThreadSummaryText]


class ToolCallPage(BaseModel):
    tool_call_id: str
    name: str | None
    total_bytes: int
    offset: int
    data: str
    next_offset: int | None


class Health(BaseModel):
    """``GET /healthz`` and ``/readyz``: readiness of each part this process runs (200 when
    every part is ready, else 503 with this body). See docs/operations.md, "Readiness"."""

    ok: bool = Field(description="every part is ready")
    status: Literal["ready", "not_ready"]
    failing: list[str] = Field(description="the parts that are not ready, by name")
    parts: dict[str, bool] = Field(
        description="each part (journal, postgres, redis, kafka, clickhouse, qdrant, "
        "object_store, loops) and whether it is ready"
    )
    errors: dict[str, str] = Field(description="for each failing part, what is wrong")
    loops: dict[str, dict[str, Any]] | None = Field(
        default=None, description="the background loops: state, restarts, last_error, since"
    )
    relays: dict[str, int] | None = Field(
        default=None,
        description="records each relay running in this process has not published yet "
        "(journal: sequenced journal rows not on the journal topic)",
    )
    servers: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="memstream up's embedded servers: state (running, restarting, failed), "
        "restarts, tries, last_error, port, pid",
    )


class Live(BaseModel):
    """``GET /livez``: the process answers (liveness; no dependency is checked)."""

    ok: Literal[True]
    status: Literal["live"]


class Generations(RootModel[dict[str, int]]):
    """``GET /admin/replay``: the current generation of each projection."""


# --- owning memory (docs/owning-memory.md) -----------------------------------------------------
class EntriesPage(BaseModel):
    """``GET .../memory/entries``: one page, newest first."""

    entries: list[MemoryEntry]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null: last")


class EntryPatchBody(BaseModel):
    """``PATCH .../memory/entries/{key}``: any of these (at least one)."""

    content: str | None = None
    importance: float | None = Field(default=None, ge=0, le=1)
    category: Category | None = None
    expires_at: str | None = Field(default=None, description="ISO-8601 in the future; null: never")


class Edited(BaseModel):
    status: Literal["replaced", "unchanged"]
    entry: MemoryEntry
    position: int = Field(description="read-your-writes: pass as 'after' to recall")


class ImportFailure(BaseModel):
    line: int = Field(description="1-based line number of the NDJSON body")
    error: ErrorDetail


class ImportReport(BaseModel):
    created: int
    replaced: int
    unchanged: int
    failed: list[ImportFailure]


class ErasureStarted(BaseModel):
    erasure_id: str


class Erasure(BaseModel):
    erasure_id: str
    kind: Literal["thread", "user"]
    status: Literal["running", "done"]
    step: str | None = Field(
        None,
        description="while running, what the erasure is doing (a step, or a long part of "
        "one, such as an index being rewritten); after a failed run, where it stopped; "
        "null once done",
    )
    stores: dict[str, int] = Field(description="what each store removed so far")
