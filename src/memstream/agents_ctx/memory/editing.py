"""The rules of owning memory: who sees what when browsing, the browse cursor, a ``PATCH``
of one entry, and one line of an NDJSON import.

Pure: plain functions over values and records (the clock's reading is passed in). The
repository (``entries.py``) runs them inside one transaction per change, so an edit or an
imported line goes through exactly the rules of ``memory_store`` (``policy.check_store``:
content limits, injection screening, PII forcing private) plus the capacity check when it
adds an entry to a category.

Guarantees:

- **Views**: an ordinary key sees what the memory tools show its caller (the agent's shared
  entries and the caller's own private ones) and may not name another user (``Forbidden``,
  field ``user_id``); an admin key sees every entry of the agent, or one user's entries.
- **Cursor**: opaque, encodes the last entry's ``(created_at, owner, key)``; pages are in
  that order, descending (newest first), so entries that exist for the whole walk are
  listed exactly once even while others are edited, added or removed (an edit keeps
  ``created_at``).
- **Patch**: only ``content``, ``importance``, ``category``, ``expires_at``; anything else,
  or nothing at all, is an ``InvalidRequest`` naming the field.
- **Import**: a line is an exported entry; it is idempotent by key and content hash (the
  same key with byte-identical content is ``unchanged``), and any failure is reported for
  that line only.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

import orjson

from memstream.agents_ctx.memory import policy
from memstream.errors import Forbidden, InvalidRequest
from memstream.schemas.records import (
    VISIBILITIES,
    Caller,
    Category,
    MemoryEntry,
    Visibility,
    parse_time,
)

LIST_LIMIT_DEFAULT: Final = 50
LIST_LIMIT_MAX: Final = 200

PATCH_FIELDS: Final = ("content", "importance", "category", "expires_at")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO: Final = timedelta(microseconds=1)


# --- views --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class View:
    """Which entries of an agent a request may see.

    ``every_user``: every entry (admin, no ``user_id``); else ``only_user`` set: the entries
    of that user (admin with ``user_id``: private ones and the shared ones they wrote);
    else shared entries plus ``visible_to``'s private ones (ordinary keys; None is an
    anonymous caller, who sees the shared entries only). A key is resolved, for get and
    patch, as the acting user's private entry, else the shared one."""

    every_user: bool = False
    only_user: str | None = None
    visible_to: str | None = None

    @property
    def acting_user(self) -> str | None:
        """The user whose private entry a key addresses (``get``, ``PATCH``)."""
        return self.only_user if self.only_user is not None else self.visible_to


def view_of(caller: Caller, user_id: str | None) -> View:
    """The view of ``caller`` asking with the ``user_id`` parameter (admin keys only)."""
    if user_id is not None and not caller.admin:
        if user_id == caller.user_id:
            return View(visible_to=user_id)
        raise Forbidden("user_id needs an admin key", field="user_id")
    if caller.admin:
        if user_id is not None:
            return View(only_user=user_id)
        return View(every_user=True, visible_to=caller.user_id)
    return View(visible_to=caller.user_id)


def resolve_limit(limit: object) -> int:
    """``limit`` of a listing: 1–200, default 50 (a query string is accepted)."""
    if limit is None or limit == "":
        return LIST_LIMIT_DEFAULT
    if isinstance(limit, str):
        try:
            limit = int(limit)
        except ValueError:
            raise InvalidRequest("limit must be an integer", field="limit") from None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidRequest("limit must be an integer", field="limit")
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidRequest(f"limit must be between 1 and {LIST_LIMIT_MAX}", field="limit")
    return limit


def validate_visibility(value: object) -> Visibility:
    if not isinstance(value, str) or value not in VISIBILITIES:
        raise InvalidRequest("visibility must be private or shared", field="visibility")
    return value  # type: ignore[return-value]


# --- cursor -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Cursor:
    """The position after the last entry of a page: ``(created_at, owner, key)``."""

    created_at: datetime
    owner: str
    key: str

    @classmethod
    def after(cls, entry: MemoryEntry) -> Cursor:
        return cls(entry.created_at, entry.owner, entry.key)

    def encode(self) -> str:
        micros = (self.created_at - _EPOCH) // _MICRO
        raw = orjson.dumps([micros, self.owner, self.key])
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, text: object) -> Cursor | None:
        """None for no cursor; ``InvalidRequest`` (field ``cursor``) for a malformed one."""
        if text is None or text == "":
            return None
        bad = InvalidRequest("cursor is not a cursor this API returned", field="cursor")
        if not isinstance(text, str):
            raise bad
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            micros, owner, key = orjson.loads(raw)
        except (binascii.Error, ValueError, TypeError):
            raise bad from None
        if not (isinstance(micros, int) and isinstance(owner, str) and isinstance(key, str)):
            raise bad
        if "\x00" in owner or "\x00" in key:  # Postgres refuses NUL in text
            raise bad
        try:
            return cls(_EPOCH + micros * _MICRO, owner, key)
        except OverflowError:
            raise bad from None


# --- patch --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EntryPatch:
    """A checked ``PATCH`` body: the fields given (``expires_at`` may be set to None)."""

    content: str | None = None
    importance: float | None = None
    category: Category | None = None
    expires_at: datetime | None = None
    sets_expiry: bool = False


def parse_patch(body: Mapping[str, object], now: datetime) -> EntryPatch:
    """Shape checks of a ``PATCH`` body (content limits come with the category, later)."""
    for name in body:
        if name not in PATCH_FIELDS:
            raise InvalidRequest(
                f"{name!r} cannot be edited (editable: {', '.join(PATCH_FIELDS)})",
                field=name or "body",  # an empty key still names where the error is
            )
    if not body:
        raise InvalidRequest(f"send at least one of {', '.join(PATCH_FIELDS)}", field="body")
    content = body.get("content")
    if "content" in body and not isinstance(content, str):
        raise InvalidRequest("content must be a string", field="content")
    importance = None
    if "importance" in body:
        if body["importance"] is None:
            raise InvalidRequest("importance must be a number", field="importance")
        importance = policy.validate_importance(body["importance"])
    category = policy.validate_category(body["category"]) if "category" in body else None
    expires_at = None
    if "expires_at" in body and body["expires_at"] is not None:
        expires_at = parse_time(body["expires_at"], "expires_at")
        if expires_at <= now:
            raise InvalidRequest(
                "expires_at must be in the future (forget the entry to remove it)",
                field="expires_at",
            )
    return EntryPatch(
        content=content if isinstance(content, str) else None,
        importance=importance,
        category=category,
        expires_at=expires_at,
        sets_expiry="expires_at" in body,
    )


@dataclass(frozen=True, slots=True)
class Edit:
    """What a patch does to an entry: ``entry`` is the new state (version not yet taken);
    ``moves`` when screening forced it private (its identity changes: the old row goes)."""

    status: Literal["replaced", "unchanged"]
    entry: MemoryEntry
    moves: bool = False
    needs_capacity: bool = False


def apply_patch(existing: MemoryEntry, patch: EntryPatch, now: datetime) -> Edit:
    """The entry after ``patch``, through every rule of ``memory_store``: content limits of
    the (new) category, injection screening, sensitive content forcing private (for the
    entry's user; ``PrivateRequiresUser`` if it has none). A category change needs room in
    the new category (``needs_capacity``; the repository counts and calls
    ``policy.check_capacity``). Changing content or category restarts the category's expiry
    (as a store replacing the entry does) unless ``expires_at`` is given."""
    req = policy.check_store(
        key=existing.key,
        content=existing.content if patch.content is None else patch.content,
        category=existing.category if patch.category is None else patch.category,
        scope=existing.visibility,
        importance=existing.importance if patch.importance is None else patch.importance,
        user_id=existing.user_id,
        existing_key=True,
    )
    restarts = req.content != existing.content or req.category != existing.category
    if patch.sets_expiry:
        expires_at = patch.expires_at
    elif restarts:
        expires_at = policy.expiry_for(req.category, now)
    else:
        expires_at = existing.expires_at
    same = (
        req.content == existing.content
        and req.category == existing.category
        and req.importance == existing.importance
        and req.visibility == existing.visibility
        and expires_at == existing.expires_at
    )
    if same:
        return Edit("unchanged", existing)
    entry = existing.with_changes(
        content=req.content,
        category=req.category,
        importance=req.importance,
        visibility=req.visibility,
        content_hash=req.content_hash,
        expires_at=expires_at,
        updated_at=now,
    )
    return Edit(
        "replaced",
        entry,
        moves=entry.owner != existing.owner,
        needs_capacity=req.category != existing.category,
    )


# --- import -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImportLine:
    """One imported line, checked: the request ``memory_store`` would get, and the exported
    fields it keeps (times, recall counters; ``has_expiry`` when the line says)."""

    req: policy.StoreRequest
    created_at: datetime | None
    updated_at: datetime | None
    expires_at: datetime | None
    has_expiry: bool
    recall_count: int
    last_recalled_at: datetime | None


#: the largest count Postgres stores (bigint)
_MAX_COUNT: Final = 2**63 - 1


def parse_import_line(raw: object, caller: Caller, now: datetime) -> ImportLine:
    """One NDJSON line (an exported entry) through the rules of ``memory_store``.

    An ordinary key imports as its caller, as ``memory_store`` stores: a line's missing or
    null ``user_id`` is the caller's own, another user's is ``Forbidden``. A line without
    ``visibility`` is private when it has a user (shared when it has none). Before, such a
    line was stored shared and owned by nobody: outside the user's capacity, untouched by
    erasing the user, and, as a ``user_profile`` fact, pinned into every user's context."""
    if not isinstance(raw, Mapping):
        raise InvalidRequest("each line must be a JSON object (an exported entry)", field="line")
    user_id = raw.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise InvalidRequest("user_id must be a string or null", field="user_id")
    if not caller.admin:
        if user_id is not None and user_id != caller.user_id:
            raise Forbidden("importing another user's entries needs an admin key", field="user_id")
        user_id = caller.user_id
    # checked here so the error names the line's field (check_store would say "scope")
    visibility = validate_visibility(raw.get("visibility", "private" if user_id else "shared"))
    req = policy.check_store(
        key=raw.get("key"),
        content=raw.get("content"),
        category=raw.get("category"),
        scope=visibility,
        importance=raw.get("importance"),
        user_id=user_id or None,
    )
    given_hash = raw.get("content_hash")
    if given_hash is not None and given_hash != req.content_hash:
        raise InvalidRequest("content_hash does not match content", field="content_hash")
    times = {}
    for name in ("created_at", "updated_at", "expires_at", "last_recalled_at"):
        value = raw.get(name)
        times[name] = None if value is None else parse_time(value, name)
    if times["expires_at"] is not None and times["expires_at"] <= now:
        raise InvalidRequest("expires_at has passed: the entry has expired", field="expires_at")
    recall_count = raw.get("recall_count", 0)
    if (
        isinstance(recall_count, bool)
        or not isinstance(recall_count, int)
        or not 0 <= recall_count <= _MAX_COUNT
    ):
        raise InvalidRequest(
            f"recall_count must be an integer from 0 to {_MAX_COUNT}", field="recall_count"
        )
    return ImportLine(
        req=req,
        created_at=times["created_at"],
        updated_at=times["updated_at"],
        expires_at=times["expires_at"],
        has_expiry="expires_at" in raw,
        recall_count=recall_count,
        last_recalled_at=times["last_recalled_at"],
    )


def imported_entry(line: ImportLine, account_id: str, agent_id: str, now: datetime) -> MemoryEntry:
    """The entry an imported line writes (created or replacing): the exported times and
    counters when the line has them."""
    entry = policy.new_entry(line.req, account_id, agent_id, now, version=0)
    return entry.with_changes(
        created_at=line.created_at or now,
        updated_at=line.updated_at or line.created_at or now,
        expires_at=line.expires_at if line.has_expiry else entry.expires_at,
        recall_count=line.recall_count,
        last_recalled_at=line.last_recalled_at,
    )
