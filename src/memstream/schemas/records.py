"""Records: the nouns of memstream (Message, ToolCall, Summary, MemoryEntry, ThreadConfig).

Frozen dataclasses with ``to_dict`` / ``from_dict``. ``from_dict`` is lenient about unknown
fields (they are ignored, so newer writers do not break older readers) and strict about the
known ones: a missing or mistyped field raises :class:`~memstream.errors.InvalidRequest`
naming it. Times are timezone-aware UTC ``datetime`` objects, ISO-8601 on the wire.

Speed: ``Message``/``MemoryEntry``/``ToolCall.from_dict`` run on every event a stream
processor reads, so each has a straight-line fast path (exact-type checks, one dict lookup per
field, a small cache of parsed ISO times, slots filled without the frozen ``__init__``). Any
input the fast path does not accept as-is goes to the original checked reader
(``_from_dict_checked``), so results and errors (the field named) are exactly the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias, cast, get_args

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
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    if t.year in (1, 9999):  # only there can the UTC instant fall outside years 1-9999
        try:
            t.astimezone(UTC)
        except OverflowError:
            msg = f"{name} is out of range (years 1 to 9999 in UTC)"
            raise InvalidRequest(msg, field=name) from None
    return t


def opt_time(d: Mapping[str, object], name: str) -> datetime | None:
    v = d.get(name)
    return None if v is None else parse_time(v, name)


def iso(t: datetime | None) -> str | None:
    """ISO-8601 UTC with millisecond precision and a ``Z`` suffix."""
    if t is None:
        return None
    global _iso_last  # noqa: PLW0603 - a one-entry cache: a batch shares one created_at
    last = _iso_last
    if last[0] is t:
        return last[1]
    out = t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    _iso_last = (t, out)
    return out


_iso_last: tuple[datetime | None, str] = (None, "")

# --- fast-path helpers -----------------------------------------------------------------------
_TIME_CACHE: dict[str, datetime] = {}
_TIME_CACHE_MAX = 4096


def _cached_time(value: str, name: str) -> datetime:
    """``parse_time`` for a string, memoized (datetimes are immutable; events of one batch
    share their times). Raises exactly what ``parse_time`` raises."""
    t = _TIME_CACHE.get(value)
    if t is None:
        t = parse_time(value, name)
        if len(_TIME_CACHE) >= _TIME_CACHE_MAX:
            _TIME_CACHE.clear()
        _TIME_CACHE[value] = t
    return t


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of a frozen slots dataclass, in ``names`` order. Import fails if
    ``names`` is not exactly the class's fields, so a new field cannot be left unset."""
    if tuple(sorted(f.name for f in fields(cls))) != tuple(sorted(names)):
        raise RuntimeError(f"fast constructor of {cls.__name__} is out of date with its fields")
    return tuple(cls.__dict__[n].__set__ for n in names)


_new = object.__new__


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
        if type(d) is dict:
            id_, name = d.get("id"), d.get("name")
            if type(id_) is str and type(name) is str:
                return _tool_call(id_, name, d.get("arguments"))
        return cls._from_dict_checked(d, prefix=prefix)

    @classmethod
    def _from_dict_checked(cls, d: Mapping[str, object], *, prefix: str = "") -> ToolCall:
        return cls(
            id=req_str(d, "id", prefix=prefix),
            name=req_str(d, "name", prefix=prefix),
            arguments=cast(JSONValue, d.get("arguments")),
        )


_TC_ID, _TC_NAME, _TC_ARGS = _slot_setters(ToolCall, ("id", "name", "arguments"))


def _tool_call(id_: str, name: str, arguments: object) -> ToolCall:
    tc: ToolCall = _new(ToolCall)
    _TC_ID(tc, id_)
    _TC_NAME(tc, name)
    _TC_ARGS(tc, arguments)
    return tc


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
        if type(d) is dict:
            msg = _message_fast(d)
            if msg is not None:
                return msg
        return cls._from_dict_checked(d)

    @classmethod
    def _from_dict_checked(cls, d: Mapping[str, object]) -> Message:
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


_MESSAGE_SLOTS = (
    "account_id",
    "agent_id",
    "thread_id",
    "offset",
    "message_id",
    "role",
    "content",
    "created_at",
    "token_count",
    "seq",
    "reasoning",
    "tool_calls",
    "tool_call_id",
    "user_id",
)
(
    _M_ACCOUNT,
    _M_AGENT,
    _M_THREAD,
    _M_OFFSET,
    _M_ID,
    _M_ROLE,
    _M_CONTENT,
    _M_CREATED,
    _M_TOKENS,
    _M_SEQ,
    _M_REASONING,
    _M_CALLS,
    _M_CALL_ID,
    _M_USER,
) = _slot_setters(Message, _MESSAGE_SLOTS)
_ROLE_SET = frozenset(ROLES)


def _message_fast(d: dict[str, object]) -> Message | None:
    """``Message.from_dict`` for well-typed input, or None (then the checked path decides)."""
    g = d.get
    account_id, agent_id, thread_id = g("account_id"), g("agent_id"), g("thread_id")
    offset, message_id, role, content = g("offset"), g("message_id"), g("role"), g("content")
    seq, token_count = g("seq"), g("token_count")
    reasoning, tool_call_id, user_id = g("reasoning"), g("tool_call_id"), g("user_id")
    created = g("created_at")
    if not (
        type(account_id) is str
        and type(agent_id) is str
        and type(thread_id) is str
        and type(offset) is int
        and type(message_id) is str
        and type(role) is str
        and role in _ROLE_SET
        and type(content) is str
        and type(created) is str
        and (reasoning is None or type(reasoning) is str)
        and (tool_call_id is None or type(tool_call_id) is str)
        and (user_id is None or type(user_id) is str)
    ):
        return None
    if seq is None:
        seq = 0
    elif type(seq) is not int:
        return None
    if token_count is None:
        token_count = 0
    elif type(token_count) is not int:
        return None
    raw_calls = g("tool_calls")
    calls: tuple[ToolCall, ...] = ()
    if raw_calls:
        if type(raw_calls) is not list:
            return None
        out = []
        for tc in raw_calls:
            if type(tc) is not dict:
                return None
            id_, name = tc.get("id"), tc.get("name")
            if type(id_) is not str or type(name) is not str:
                return None
            out.append(_tool_call(id_, name, tc.get("arguments")))
        calls = tuple(out)
    try:
        created_at = _cached_time(created, "created_at")
    except InvalidRequest:
        return None
    return message_unchecked(
        account_id,
        agent_id,
        thread_id,
        offset,
        message_id,
        cast(Role, role),  # checked against _ROLE_SET above
        content,
        created_at,
        token_count,
        seq,
        reasoning,
        calls,
        tool_call_id,
        user_id,
    )


def message_unchecked(
    account_id: str,
    agent_id: str,
    thread_id: str,
    offset: int,
    message_id: str,
    role: Role,
    content: str,
    created_at: datetime,
    token_count: int,
    seq: int,
    reasoning: str | None,
    tool_calls: tuple[ToolCall, ...],
    tool_call_id: str | None,
    user_id: str | None,
) -> Message:
    """``Message(...)`` with exactly these fields, built without the frozen dataclass's
    per-field ``object.__setattr__`` (about twice as fast). It checks nothing: for writers
    whose input is already validated (the journal's committer)."""
    msg: Message = _new(Message)
    _M_ACCOUNT(msg, account_id)
    _M_AGENT(msg, agent_id)
    _M_THREAD(msg, thread_id)
    _M_OFFSET(msg, offset)
    _M_ID(msg, message_id)
    _M_ROLE(msg, role)
    _M_CONTENT(msg, content)
    _M_CREATED(msg, created_at)
    _M_TOKENS(msg, token_count)
    _M_SEQ(msg, seq)
    _M_REASONING(msg, reasoning)
    _M_CALLS(msg, tool_calls)
    _M_CALL_ID(msg, tool_call_id)
    _M_USER(msg, user_id)
    return msg


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
        if type(d) is dict:
            entry = _entry_fast(d)
            if entry is not None:
                return entry
        return cls._from_dict_checked(d)

    @classmethod
    def _from_dict_checked(cls, d: Mapping[str, object]) -> MemoryEntry:
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


_ENTRY_SLOTS = (
    "account_id",
    "agent_id",
    "key",
    "content",
    "category",
    "visibility",
    "importance",
    "content_hash",
    "created_at",
    "updated_at",
    "user_id",
    "expires_at",
    "recall_count",
    "last_recalled_at",
    "version",
)
(
    _E_ACCOUNT,
    _E_AGENT,
    _E_KEY,
    _E_CONTENT,
    _E_CATEGORY,
    _E_VISIBILITY,
    _E_IMPORTANCE,
    _E_HASH,
    _E_CREATED,
    _E_UPDATED,
    _E_USER,
    _E_EXPIRES,
    _E_RECALLS,
    _E_RECALLED,
    _E_VERSION,
) = _slot_setters(MemoryEntry, _ENTRY_SLOTS)
_CATEGORY_SET = frozenset(CATEGORIES)
_VISIBILITY_SET = frozenset(VISIBILITIES)


def _entry_fast(d: dict[str, object]) -> MemoryEntry | None:
    """``MemoryEntry.from_dict`` for well-typed input, or None (the checked path decides)."""
    g = d.get
    account_id, agent_id, key, content = g("account_id"), g("agent_id"), g("key"), g("content")
    category, visibility, importance = g("category"), g("visibility"), g("importance")
    content_hash, user_id = g("content_hash"), g("user_id")
    created, updated, expires, recalled = (
        g("created_at"),
        g("updated_at"),
        g("expires_at"),
        g("last_recalled_at"),
    )
    recall_count, version = g("recall_count"), g("version")
    if not (
        type(account_id) is str
        and type(agent_id) is str
        and type(key) is str
        and type(content) is str
        and type(category) is str
        and category in _CATEGORY_SET
        and type(visibility) is str
        and visibility in _VISIBILITY_SET
        and type(content_hash) is str
        and type(created) is str
        and type(updated) is str
        and (expires is None or type(expires) is str)
        and (recalled is None or type(recalled) is str)
        and (user_id is None or type(user_id) is str)
    ):
        return None
    if type(importance) is float:
        pass
    elif type(importance) is int:
        importance = float(importance)
    else:
        return None
    if recall_count is None:
        recall_count = 0
    elif type(recall_count) is not int:
        return None
    if not version:  # None, missing or 0: the checked path reads ``version or 1``
        version = 1
    elif type(version) is not int:
        return None
    try:
        created_at = _cached_time(created, "created_at")
        updated_at = _cached_time(updated, "updated_at")
        expires_at = None if expires is None else _cached_time(expires, "expires_at")
        last_recalled_at = None if recalled is None else _cached_time(recalled, "last_recalled_at")
    except InvalidRequest:
        return None
    entry: MemoryEntry = _new(MemoryEntry)
    _E_ACCOUNT(entry, account_id)
    _E_AGENT(entry, agent_id)
    _E_KEY(entry, key)
    _E_CONTENT(entry, content)
    _E_CATEGORY(entry, category)
    _E_VISIBILITY(entry, visibility)
    _E_IMPORTANCE(entry, importance)
    _E_HASH(entry, content_hash)
    _E_CREATED(entry, created_at)
    _E_UPDATED(entry, updated_at)
    _E_USER(entry, user_id)
    _E_EXPIRES(entry, expires_at)
    _E_RECALLS(entry, recall_count)
    _E_RECALLED(entry, last_recalled_at)
    _E_VERSION(entry, version)
    return entry


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the account (from the API key), the agent, and the end user if any.

    ``admin`` is true for an admin key: it may act across the account's users (browse,
    edit, export, import, erase); the memory tools ignore it."""

    account_id: str
    agent_id: str
    user_id: str | None = None
    admin: bool = False


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
