"""Records: the nouns of memstream (Message, ToolCall, Summary, MemoryEntry, ThreadConfig).

Frozen dataclasses with ``to_dict`` / ``from_dict``. ``from_dict`` is lenient about unknown
fields (they are ignored, so newer writers do not break older readers) and strict about the
known ones: a missing or mistyped field raises :class:`~memstream.errors.InvalidRequest`
naming it. Times are timezone-aware UTC ``datetime`` objects, ISO-8601 on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal, TypeAlias, cast, get_args

from memstream.errors import InvalidRequest
from memstream.schemas.limits import WINDOW_MESSAGES

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)

Category = Literal["user_profile", "project_fact", "observation"]
CATEGORIES: tuple[str, ...] = get_args(Category)

Visibility = Literal["private", "shared"]
VISIBILITIES: tuple[str, ...] = get_args(Visibility)


# --- field readers: each names the field it failed on --------------------------------------
def req_str(d: Mapping[str, object], name: str, *, prefix: str = "") -> str:
    v = d.get(name)
    if not isinstance(v, str):
        raise InvalidRequest(f"{prefix}{name} must be a string", field=prefix + name)
    return v


def opt_str(d: Mapping[str, object], name: str, *, prefix: str = "") -> str | None:
    v = d.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise InvalidRequest(f"{prefix}{name} must be a string or null", field=prefix + name)
    return v


def req_int(d: Mapping[str, object], name: str, *, prefix: str = "") -> int:
    v = d.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise InvalidRequest(f"{prefix}{name} must be an integer", field=prefix + name)
    return v


def req_float(d: Mapping[str, object], name: str, *, prefix: str = "") -> float:
    v = d.get(name)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise InvalidRequest(f"{prefix}{name} must be a number", field=prefix + name)
    return float(v)


def parse_time(value: object, name: str) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be an ISO-8601 time", field=name)
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{name} must be an ISO-8601 time", field=name) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def opt_time(d: Mapping[str, object], name: str) -> datetime | None:
    v = d.get(name)
    return None if v is None else parse_time(v, name)


def iso(t: datetime | None) -> str | None:
    """ISO-8601 UTC with millisecond precision and a ``Z`` suffix."""
    if t is None:
        return None
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- records -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call an assistant message asks for. ``arguments`` is any JSON value (often a string)."""

    id: str
    name: str
    arguments: JSONValue = None

    def to_dict(self) -> JSONObject:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: Mapping[str, object], *, prefix: str = "") -> ToolCall:
        return cls(
            id=req_str(d, "id", prefix=prefix),
            name=req_str(d, "name", prefix=prefix),
            arguments=cast(JSONValue, d.get("arguments")),
        )


@dataclass(frozen=True, slots=True)
class Message:
    """One journal message of a thread, as stored and as published on the ``journal`` topic.

    ``offset`` is per thread, dense and monotonic from 0; ``message_id`` is unique across the
    deployment; ``seq`` is the journal's global sequence (the relay's order).
    """

    account_id: str
    agent_id: str
    thread_id: str
    offset: int
    message_id: str
    role: Role
    content: str
    created_at: datetime
    token_count: int = 0
    seq: int = 0
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    user_id: str | None = None

    def to_dict(self) -> JSONObject:
        return {
            "account_id": self.account_id,
            "agent_id": self.agent_id,
            "thread_id": self.thread_id,
            "offset": self.offset,
            "message_id": self.message_id,
            "seq": self.seq,
            "role": self.role,
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [tc.to_dict() for tc in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "token_count": self.token_count,
            "user_id": self.user_id,
            "created_at": iso(self.created_at),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Message:
        role = req_str(d, "role")
        if role not in ROLES:
            raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", field="role")
        raw_calls = d.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise InvalidRequest("tool_calls must be a list", field="tool_calls")
        calls = []
        for i, tc in enumerate(raw_calls):
            if not isinstance(tc, Mapping):
                raise InvalidRequest("tool call must be an object", field=f"tool_calls[{i}]")
            calls.append(ToolCall.from_dict(tc, prefix=f"tool_calls[{i}]."))
        return cls(
            account_id=req_str(d, "account_id"),
            agent_id=req_str(d, "agent_id"),
            thread_id=req_str(d, "thread_id"),
            offset=req_int(d, "offset"),
            message_id=req_str(d, "message_id"),
            seq=int(cast(int, d.get("seq") or 0)),
            role=cast(Role, role),
            content=req_str(d, "content"),
            reasoning=opt_str(d, "reasoning"),
            tool_calls=tuple(calls),
            tool_call_id=opt_str(d, "tool_call_id"),
            token_count=int(cast(int, d.get("token_count") or 0)),
            user_id=opt_str(d, "user_id"),
            created_at=parse_time(d.get("created_at"), "created_at"),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """A thread's rolling summary: exactly the spec's seven fields (plus nothing else)."""

    version: int
    timestamp: datetime
    last_message_offset: int
    last_message_id: str
    content: str
    token_count: int
    message_count: int

    def to_dict(self) -> JSONObject:
        return {
            "version": self.version,
            "timestamp": iso(self.timestamp),
            "last_message_offset": self.last_message_offset,
            "last_message_id": self.last_message_id,
            "content": self.content,
            "token_count": self.token_count,
            "message_count": self.message_count,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Summary:
        return cls(
            version=req_int(d, "version"),
            timestamp=parse_time(d.get("timestamp"), "timestamp"),
            last_message_offset=req_int(d, "last_message_offset"),
            last_message_id=req_str(d, "last_message_id"),
            content=req_str(d, "content"),
            token_count=req_int(d, "token_count"),
            message_count=req_int(d, "message_count"),
        )


@dataclass(frozen=True, slots=True)
class ThreadConfig:
    """``metadata.config`` of a thread. ``max_working_memory_messages`` can only lower the window."""

    max_working_memory_messages: int | None = None

    def window(self) -> int:
        """The effective window: the spec's 20, lowered (never raised) by the thread config."""
        n = self.max_working_memory_messages
        if n is None:
            return WINDOW_MESSAGES
        return max(0, min(n, WINDOW_MESSAGES))

    def to_dict(self) -> JSONObject:
        out: JSONObject = {}
        if self.max_working_memory_messages is not None:
            out["max_working_memory_messages"] = self.max_working_memory_messages
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object] | None) -> ThreadConfig:
        if not d:
            return cls()
        v = d.get("max_working_memory_messages")
        if v is None:
            return cls()
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidRequest(
                "max_working_memory_messages must be a non-negative integer",
                field="metadata.config.max_working_memory_messages",
            )
        return cls(max_working_memory_messages=v)


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    """One curated agent-memory entry. Postgres holds the authoritative copy.

    Identity is ``(account_id, agent_id, owner, key)`` where ``owner`` is the user id for a
    ``private`` entry and ``""`` for a ``shared`` one. ``version`` increases on every change,
    so projections can ignore stale events.
    """

    account_id: str
    agent_id: str
    key: str
    content: str
    category: Category
    visibility: Visibility
    importance: float
    content_hash: str
    created_at: datetime
    updated_at: datetime
    user_id: str | None = None
    expires_at: datetime | None = None
    recall_count: int = 0
    last_recalled_at: datetime | None = None
    version: int = 1

    @property
    def owner(self) -> str:
        return self.user_id if self.visibility == "private" and self.user_id else ""

    def with_changes(self, **changes: object) -> MemoryEntry:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_dict(self) -> JSONObject:
        """The entry as the API shows it (ARCHITECTURE.md's entry fields)."""
        return {
            "key": self.key,
            "content": self.content,
            "category": self.category,
            "visibility": self.visibility,
            "importance": self.importance,
            "user_id": self.user_id,
            "content_hash": self.content_hash,
            "expires_at": iso(self.expires_at),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "recall_count": self.recall_count,
            "last_recalled_at": iso(self.last_recalled_at),
        }

    def to_event_dict(self) -> JSONObject:
        """The entry as carried on the ``memory`` topic (adds tenancy and version)."""
        out = self.to_dict()
        out["account_id"] = self.account_id
        out["agent_id"] = self.agent_id
        out["version"] = self.version
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> MemoryEntry:
        category = req_str(d, "category")
        if category not in CATEGORIES:
            raise InvalidRequest(
                f"category must be one of {', '.join(CATEGORIES)}", field="category"
            )
        visibility = req_str(d, "visibility")
        if visibility not in VISIBILITIES:
            raise InvalidRequest("visibility must be private or shared", field="visibility")
        return cls(
            account_id=req_str(d, "account_id"),
            agent_id=req_str(d, "agent_id"),
            key=req_str(d, "key"),
            content=req_str(d, "content"),
            category=cast(Category, category),
            visibility=cast(Visibility, visibility),
            importance=req_float(d, "importance"),
            content_hash=req_str(d, "content_hash"),
            created_at=parse_time(d.get("created_at"), "created_at"),
            updated_at=parse_time(d.get("updated_at"), "updated_at"),
            user_id=opt_str(d, "user_id"),
            expires_at=opt_time(d, "expires_at"),
            recall_count=int(cast(int, d.get("recall_count") or 0)),
            last_recalled_at=opt_time(d, "last_recalled_at"),
            version=int(cast(int, d.get("version") or 1)),
        )


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the account (from the API key), the agent, and the end user if any."""

    account_id: str
    agent_id: str
    user_id: str | None = None


@dataclass(frozen=True, slots=True)
class ThreadRef:
    """A thread's full identity. Thread ids are only unique inside one (account, agent), so
    every store and topic keys by all three; ``key`` is the Kafka key and journal prefix."""

    account_id: str
    agent_id: str
    thread_id: str

    @property
    def key(self) -> str:
        return f"{self.account_id}/{self.agent_id}/{self.thread_id}"


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message as a producer hands it to the journal, before offset/id/seq are assigned."""

    role: Role
    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    user_id: str | None = None
