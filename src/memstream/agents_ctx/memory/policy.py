"""The rules of ``memory_store``: validation, scope resolution, expiry, and the store decision.

Pure: plain functions over values and :class:`~memstream.schemas.records.MemoryEntry`
records; the clock's reading is passed in. The repository (``store.py``) runs them inside
one transaction, so what these functions decide is exactly what gets written.

Guarantees:

- Every validation error is an :class:`~memstream.errors.InvalidRequest` (or subclass)
  naming the field: ``key``, ``content``, ``category``, ``scope``, ``importance``.
- Content longer than its category's maximum (2,000 / 4,000 / 2,000 characters, counted as
  Unicode code points) raises :class:`~memstream.errors.ContentTooLong`.
- ``private`` with no authenticated user silently becomes ``shared``; content carrying
  credentials or PII becomes ``private``, or raises
  :class:`~memstream.errors.PrivateRequiresUser` when there is no user.
- :func:`decide_store`: same key and byte-identical content is a no-op; same key and
  different content replaces (no capacity check); anything else is created only if both
  the agent's and the user's capacity for the category have room
  (:class:`~memstream.errors.CapacityExceeded` otherwise).
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, cast

from memstream.agents_ctx.memory.screening import find_injection, find_sensitive
from memstream.errors import (
    CapacityExceeded,
    ContentTooLong,
    InvalidRequest,
    PrivateRequiresUser,
    PromptInjection,
)
from memstream.schemas.limits import (
    CATEGORY_LIMITS,
    IMPORTANCE_DEFAULT,
    IMPORTANCE_MAX,
    IMPORTANCE_MIN,
    MEMORY_KEY_MAX_CHARS,
    OBSERVATION_TTL_DAYS,
)
from memstream.schemas.records import CATEGORIES, VISIBILITIES, Category, MemoryEntry, Visibility

Scope = Visibility


# --- validation ---------------------------------------------------------------------------
def validate_key(key: object) -> str:
    """A key is a non-blank string of at most 200 characters with no control characters.

    Keys are identities: they are compared byte for byte and never trimmed or case-folded.
    """
    if not isinstance(key, str):
        raise InvalidRequest("key must be a string", field="key")
    if not key.strip():
        raise InvalidRequest("key must not be empty", field="key")
    if len(key) > MEMORY_KEY_MAX_CHARS:
        raise InvalidRequest(f"key must be at most {MEMORY_KEY_MAX_CHARS} characters", field="key")
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in key):
        raise InvalidRequest("key must not contain control or format characters", field="key")
    return key


def validate_new_key(key: object) -> str:
    """A key being stored (``memory_store``, an imported line): :func:`validate_key`, and not
    ``.`` or ``..``. A key is a path segment of ``/memory/entries/{key}``, where such a
    segment is one that URL normalization removes (browsers, proxies, most HTTP clients), as
    ``validation.check_id`` refuses them for ids. Entries stored under them before stay
    readable, editable and forgettable (only new ones are refused)."""
    k = validate_key(key)
    if k in (".", ".."):
        raise InvalidRequest("key must not be '.' or '..'", field="key")
    return k


def validate_category(category: object) -> Category:
    if not isinstance(category, str) or category not in CATEGORIES:
        raise InvalidRequest(f"category must be one of {', '.join(CATEGORIES)}", field="category")
    return cast(Category, category)


def validate_scope(scope: object) -> Scope:
    if not isinstance(scope, str) or scope not in VISIBILITIES:
        raise InvalidRequest("scope must be private or shared", field="scope")
    return cast(Scope, scope)


def validate_importance(importance: object) -> float:
    """None means the default 0.5; otherwise a finite number in [0.0, 1.0] (bounds included)."""
    if importance is None:
        return IMPORTANCE_DEFAULT
    if isinstance(importance, bool) or not isinstance(importance, int | float):
        raise InvalidRequest("importance must be a number", field="importance")
    value = float(importance)
    if not math.isfinite(value) or not IMPORTANCE_MIN <= value <= IMPORTANCE_MAX:
        raise InvalidRequest(
            f"importance must be between {IMPORTANCE_MIN} and {IMPORTANCE_MAX}",
            field="importance",
        )
    return value


def validate_content(content: object, category: Category) -> str:
    """Non-blank text within the category's maximum length (``ContentTooLong`` past it)."""
    if not isinstance(content, str):
        raise InvalidRequest("content must be a string", field="content")
    if not content.strip():
        raise InvalidRequest("content must not be empty", field="content")
    limit = CATEGORY_LIMITS[category].max_content_chars
    if len(content) > limit:
        raise ContentTooLong(
            f"content is {len(content)} characters; {category} allows at most {limit}",
            field="content",
        )
    return content


# --- scope --------------------------------------------------------------------------------
def resolve_visibility(scope: Scope, user_id: str | None, *, sensitive: bool) -> Visibility:
    """The visibility an entry gets.

    - Sensitive content (credentials, PII) is always ``private``; with no user it raises
      :class:`PrivateRequiresUser` (field ``content``).
    - ``private`` with no user silently becomes ``shared`` (the spec's MCP-gateway case).
    """
    if sensitive:
        if not user_id:
            raise PrivateRequiresUser(
                "content looks like credentials or personal data; it can only be stored "
                "privately, and there is no user to store it for",
                field="content",
            )
        return "private"
    if scope == "private" and not user_id:
        return "shared"
    return scope


def owner_of(visibility: Visibility, user_id: str | None) -> str:
    """The identity component: the user for a private entry, ``""`` for a shared one."""
    return user_id or "" if visibility == "private" else ""


# --- derived fields -----------------------------------------------------------------------
def content_hash(content: str) -> str:
    """sha256 hex of the UTF-8 bytes: equal hashes mean byte-identical content."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def expiry_for(category: Category, created_at: datetime) -> datetime | None:
    """``observation`` entries expire 30 days after creation; the others never do."""
    if category == "observation":
        return created_at + timedelta(days=OBSERVATION_TTL_DAYS)
    return None


def is_expired(entry: MemoryEntry, now: datetime) -> bool:
    return entry.expires_at is not None and entry.expires_at <= now


def is_visible(entry: MemoryEntry, account_id: str, agent_id: str, user_id: str | None) -> bool:
    """Shared entries of the agent, plus the caller's own private entries."""
    if entry.account_id != account_id or entry.agent_id != agent_id:
        return False
    if entry.visibility == "shared":
        return True
    return user_id is not None and entry.user_id == user_id


# --- the request, checked -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoreRequest:
    """A ``memory_store`` call after validation and screening: safe to write."""

    key: str
    content: str
    category: Category
    visibility: Visibility
    importance: float
    user_id: str | None
    content_hash: str

    @property
    def owner(self) -> str:
        return owner_of(self.visibility, self.user_id)


def check_store(
    *,
    key: object,
    content: object,
    category: object,
    scope: object,
    importance: object,
    user_id: str | None,
    existing_key: bool = False,
) -> StoreRequest:
    """Validate and screen one ``memory_store`` call, in the order a user would want to be
    told: shape of each field, then length, then injection (rejected), then sensitive data
    (forces private, or rejected without a user). ``existing_key``: the key of an entry
    already stored (an edit), checked by :func:`validate_key` only, not as a new key."""
    k = validate_key(key) if existing_key else validate_new_key(key)
    cat = validate_category(category)
    sc = validate_scope(scope)
    imp = validate_importance(importance)
    text = validate_content(content, cat)
    for field, value in (("content", text), ("key", k)):
        pattern = find_injection(value)
        if pattern is not None:
            raise PromptInjection(
                f"{field} matches a prompt-injection pattern ({pattern}); not stored",
                field=field,
            )
    sensitive = find_sensitive(text) is not None or find_sensitive(k) is not None
    visibility = resolve_visibility(sc, user_id, sensitive=sensitive)
    return StoreRequest(
        key=k,
        content=text,
        category=cat,
        visibility=visibility,
        importance=imp,
        user_id=user_id or None,
        content_hash=content_hash(text),
    )


# --- the decision -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Usage:
    """Live (unexpired) entries of one category: the agent's total, and the user's own."""

    agent: int
    user: int


StoreAction = Literal["create", "unchanged", "replace"]


def plan_store(
    req: StoreRequest, existing: MemoryEntry | None, now: datetime
) -> tuple[StoreAction, bool]:
    """What ``memory_store`` does with a checked request, given the entry already at the same
    identity (``None`` if there is none), and whether the write needs room in
    ``req.category`` (then :func:`check_capacity` must pass before it commits).

    An expired entry at the same identity counts as absent (it is logically gone; the write
    reuses its row, with a capacity check as for any new entry). The same content in the
    same category is a no-op; a change of category is a replace that takes the new
    category's expiry and needs room in the new category.
    """
    if existing is not None and not is_expired(existing, now):
        if existing.category != req.category:
            return "replace", True
        if existing.content == req.content:
            return "unchanged", False
        return "replace", False
    return "create", True


def decide_store(
    req: StoreRequest, existing: MemoryEntry | None, usage: Usage, now: datetime
) -> StoreAction:
    """:func:`plan_store` with the capacity check applied to ``usage``, the category's
    usage without this entry (:class:`~memstream.errors.CapacityExceeded` if it is full)."""
    action, needs_room = plan_store(req, existing, now)
    if needs_room:
        check_capacity(req.category, req.user_id, usage)
    return action


def check_capacity(category: Category, user_id: str | None, usage: Usage) -> None:
    """Room for one more ``category`` entry, for the agent and (with a user) for the user,
    given the category's current usage; :class:`CapacityExceeded` otherwise, naming the
    field ``category`` (the limit is per category)."""
    limits = CATEGORY_LIMITS[category]
    if usage.agent >= limits.per_agent:
        raise CapacityExceeded(
            f"this agent already holds {usage.agent} {category} entries "
            f"(the maximum is {limits.per_agent})",
            field="category",
        )
    if user_id is not None and usage.user >= limits.per_user:
        raise CapacityExceeded(
            f"this user already holds {usage.user} {category} entries "
            f"(the maximum per user is {limits.per_user})",
            field="category",
        )


def group_fits(
    category: Category, counts: Mapping[str | None, int], authors: Iterable[str]
) -> bool:
    """Whether a group of stores written together (group commit) fits ``category`` of one
    agent: ``counts`` are its live entries per ``user_id`` (``None``: entries without one)
    with the group's own rows written, ``authors`` the users of the group's new entries.
    For a group whose writes only add entries to their category (creates) or replace
    entries within it, True means: running the group's stores one at a time, replacements
    first, passes :func:`check_capacity` at every step (the counts only grow, up to these),
    so the group may commit. False means: run them one at a time, and let
    :func:`check_capacity` refuse the ones past a limit."""
    limits = CATEGORY_LIMITS[category]
    if sum(counts.values()) > limits.per_agent:
        return False
    return all(counts.get(u, 0) <= limits.per_user for u in authors)


def new_entry(
    req: StoreRequest, account_id: str, agent_id: str, now: datetime, version: int
) -> MemoryEntry:
    """The entry a ``create`` writes."""
    return MemoryEntry(
        account_id=account_id,
        agent_id=agent_id,
        key=req.key,
        content=req.content,
        category=req.category,
        visibility=req.visibility,
        importance=req.importance,
        content_hash=req.content_hash,
        created_at=now,
        updated_at=now,
        user_id=req.user_id,
        expires_at=expiry_for(req.category, now),
        version=version,
    )


def replaced_entry(
    existing: MemoryEntry, req: StoreRequest, now: datetime, version: int
) -> MemoryEntry:
    """The entry a ``replace`` writes: new content, category, importance and author; the
    creation time and recall counters are kept; an observation's 30 days restart from the
    replacement (new content is a new observation)."""
    return existing.with_changes(
        content=req.content,
        category=req.category,
        importance=req.importance,
        content_hash=req.content_hash,
        user_id=req.user_id,
        updated_at=now,
        expires_at=expiry_for(req.category, now),
        version=version,
    )
