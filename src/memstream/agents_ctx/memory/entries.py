"""``MemoryEntries``: browse, get, edit, export and import an agent's memory entries, over
Postgres (the rules are in ``editing.py`` and ``policy.py``).

Guarantees:

- **Memory binding**: ``PATCH`` and import need the Memory capability bound, like
  ``memory_store`` (``403 memory_not_bound``); browse, get and export do not.
- **Same rules as the memory tools**: an edit or an imported line is screened, length
  checked, forced private when sensitive and capacity checked, under the agent's capacity
  lock taken last (``outbox.capacity_usage``), so concurrent stores cannot push a category
  past its limit.
- **Atomic, indexed**: every change and its ``memory.*`` outbox event commit together, so
  the memory projector keeps the recall index in step (an edit is ``memory.replaced``; an
  edit that moves an entry to private is ``memory.forgotten`` of the old identity plus
  ``memory.stored`` of the new one).
- **Stable pages**: newest first by ``(created_at, owner, key)``, keyset cursor (see
  ``editing.Cursor``); live entries only.
- **Import**: one transaction per line; a failed line writes nothing and is reported with
  its (1-based) line number and error, the others go on. A connection is held only for a
  line's own transaction (never while the body streams in), and its waits for a
  connection, a lock or a statement are bounded (``bounded.PgWaits``): past them the import
  answers 503 ``store_busy`` with ``Retry-After`` instead of hanging.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

import asyncpg
import orjson

from memstream.agents_ctx.access import MemoryBinding, require_memory
from memstream.agents_ctx.memory import editing, policy
from memstream.agents_ctx.memory.bounded import PgWaits, bounded_transaction
from memstream.agents_ctx.memory.editing import Cursor, View
from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    NEXT_VERSION,
    append_events,
    capacity_usage,
    entry_of_row,
    tombstone_of_row,
    write_entry_if,
)
from memstream.agents_ctx.memory.semantic_screen import SemanticScreen
from memstream.agents_ctx.validation import check_json
from memstream.clock import Clock
from memstream.errors import (
    Conflict,
    InvalidRequest,
    MemstreamError,
    NotFound,
    PromptInjection,
    RetryableInfraError,
)
from memstream.schemas.records import Caller, Category, MemoryEntry, Visibility

EXPORT_PAGE: Final = 500

# $1 account, $2 agent, $3 now; then the view, the filters and the cursor (see _where).
_LIVE: Final = "account_id = $1 AND agent_id = $2 AND (expires_at IS NULL OR expires_at > $3)"


@dataclass(frozen=True, slots=True)
class Filters:
    category: Category | None = None
    visibility: Visibility | None = None
    q: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[MemoryEntry]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class EditResult:
    status: Literal["replaced", "unchanged"]
    entry: MemoryEntry


@dataclass
class ImportReport:
    created: int = 0
    replaced: int = 0
    unchanged: int = 0
    failed: list[dict[str, object]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "created": self.created,
            "replaced": self.replaced,
            "unchanged": self.unchanged,
            "failed": self.failed,
        }


def _like(q: str) -> str:
    """A substring pattern for ILIKE with ``%``, ``_`` and ``\\`` taken literally."""
    return "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _where(view: View, filters: Filters, cursor: Cursor | None, args: list[object]) -> str:
    """The WHERE clause of a listing; appends its parameters to ``args`` ($1–$3 taken)."""

    def arg(value: object) -> str:
        args.append(value)
        return f"${len(args)}"

    parts = [_LIVE]
    if view.only_user is not None:
        parts.append(f"user_id = {arg(view.only_user)}")
    elif not view.every_user:
        parts.append(f"(owner = '' OR owner = {arg(view.visible_to)})")
    if filters.category is not None:
        parts.append(f"category = {arg(filters.category)}")
    if filters.visibility is not None:
        parts.append(f"visibility = {arg(filters.visibility)}")
    if filters.q:
        pattern = arg(_like(filters.q))
        parts.append(f"(content ILIKE {pattern} OR key ILIKE {pattern})")
    if cursor is not None:
        parts.append(
            f"(created_at, owner, key) < ({arg(cursor.created_at)}, {arg(cursor.owner)}, "
            f"{arg(cursor.key)})"
        )
    return " AND ".join(parts)


class MemoryEntries:
    """Owning memory: the entries routes (HTTP, CLI and client go through these)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        clock: Clock,
        binding: MemoryBinding,
        waits: PgWaits | None = None,
        semantic_screen: SemanticScreen | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._waits = waits or PgWaits()
        # memory_store's second injection screen: an edit or an import is no way around it
        self._semantic = semantic_screen
        # writes (PATCH, import) need Memory bound, like memory_store; reads (browse, get,
        # export) do not, so a user can always see and take what was stored about them
        self._binding = binding

    # --- browse ---------------------------------------------------------------------------
    async def list(
        self,
        caller: Caller,
        view: View,
        filters: Filters,
        limit: int,
        cursor: Cursor | None = None,
    ) -> Page:
        args: list[object] = [caller.account_id, caller.agent_id, self._clock.now()]
        where = _where(view, filters, cursor, args)
        args.append(limit + 1)
        rows = await self._pool.fetch(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE {where} "
            f"ORDER BY created_at DESC, owner DESC, key DESC LIMIT ${len(args)}",
            *args,
        )
        entries = [entry_of_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(entries, Cursor.after(entries[-1]).encode() if more and entries else None)

    async def export(
        self, caller: Caller, view: View, filters: Filters | None = None
    ) -> AsyncIterator[MemoryEntry]:
        """Every entry of the view, newest first, fetched a page at a time."""
        cursor: Cursor | None = None
        while True:
            page = await self.list(caller, view, filters or Filters(), EXPORT_PAGE, cursor)
            for e in page.entries:
                yield e
            if page.next_cursor is None:
                return
            cursor = Cursor.after(page.entries[-1])

    async def get(self, caller: Caller, view: View, key: object) -> MemoryEntry:
        """The entry under ``key``: the acting user's private one, else the shared one."""
        k = policy.validate_key(key)
        row = await self._pool.fetchrow(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE {_LIVE} AND key = $4 "
            "AND (owner = '' OR owner = $5) ORDER BY owner DESC LIMIT 1",
            caller.account_id,
            caller.agent_id,
            self._clock.now(),
            k,
            view.acting_user or "",
        )
        if row is None:
            raise NotFound(f"no memory entry {k!r}", field="key")
        return entry_of_row(row)

    # --- edit -----------------------------------------------------------------------------
    async def patch(
        self, caller: Caller, view: View, key: object, body: dict[str, object]
    ) -> EditResult:
        await require_memory(self._binding, caller)
        now = self._clock.now()
        patch = editing.parse_patch(body, now)
        if patch.content is not None:
            await self._screen(patch.content)
        current = await self.get(caller, view, key)
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE {_LIVE} "
                "AND owner = $4 AND key = $5 FOR UPDATE",
                caller.account_id,
                caller.agent_id,
                now,
                current.owner,
                current.key,
            )
            if row is None:
                raise NotFound(f"no memory entry {current.key!r}", field="key")
            existing = entry_of_row(row)
            edit = editing.apply_patch(existing, patch, now)
            if edit.status == "unchanged":
                return EditResult("unchanged", existing)
            found: int | None = existing.version
            if edit.moves:
                found = await _take_identity(conn, edit.entry, now)
                gone = await conn.fetch(
                    f"DELETE FROM memory_entries WHERE account_id = $1 AND agent_id = $2 "
                    f"AND owner = $3 AND key = $4 "
                    f"RETURNING {ENTRY_COLUMNS}, {NEXT_VERSION} AS tomb_version",
                    existing.account_id,
                    existing.agent_id,
                    existing.owner,
                    existing.key,
                )
                await append_events(
                    conn, "memory.forgotten", [tombstone_of_row(r) for r in gone], now
                )
            written = await _write(conn, edit.entry, found)
            await append_events(
                conn, "memory.stored" if edit.moves else "memory.replaced", [written], now
            )
            if edit.needs_capacity:  # last: the capacity lock (see outbox.capacity_usage)
                usage = await capacity_usage(conn, written, now, without_itself=True)
                policy.check_capacity(written.category, written.user_id, usage)
        return EditResult("replaced", written)

    # --- import ---------------------------------------------------------------------------
    async def import_lines(self, caller: Caller, lines: AsyncIterable[bytes]) -> ImportReport:
        """Each non-blank line through ``memory_store``'s rules, idempotent by key and
        content hash; bad lines are reported, not fatal.

        Bounded: a line is parsed and checked before any connection is taken, and a
        connection is held only for that line's transaction (never while the body streams
        in), whose lock and statement waits are bounded (``PgWaits``). A line that cannot
        get its connection or lock in time stops the import with ``StoreBusy`` (503): the
        lines before it are applied, and importing the same body again is safe."""
        await require_memory(self._binding, caller)
        report = ImportReport()
        number = 0
        async for raw in lines:
            number += 1
            if not raw.strip():
                continue
            try:
                line = editing.parse_import_line(_json_line(raw), caller, self._clock.now())
                await self._screen(line.req.content)
                status = await self._import_one(caller, line, number)
            except RetryableInfraError:
                raise
            except MemstreamError as e:
                failure: dict[str, object] = {"line": number, "error": e.to_dict()}
                report.failed.append(failure)
                continue
            setattr(report, status, getattr(report, status) + 1)
        return report

    async def _screen(self, content: str) -> None:
        """The semantic injection screen ``memory_store`` runs after the patterns."""
        if self._semantic is not None and await self._semantic.is_injection(content):
            raise PromptInjection(
                "content resembles a prompt injection (semantic screen)", field="content"
            )

    async def _import_one(
        self, caller: Caller, line: editing.ImportLine, number: int
    ) -> Literal["created", "replaced", "unchanged"]:
        now = self._clock.now()
        entry = editing.imported_entry(line, caller.account_id, caller.agent_id, now)
        async with bounded_transaction(self._pool, self._waits, f"import line {number}") as conn:
            row = await conn.fetchrow(
                f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE account_id = $1 "
                "AND agent_id = $2 AND owner = $3 AND key = $4 FOR UPDATE",
                caller.account_id,
                caller.agent_id,
                line.req.owner,
                line.req.key,
            )
            existing = None if row is None else entry_of_row(row)
            live = existing is not None and not policy.is_expired(existing, now)
            if existing is not None and live and existing.content_hash == entry.content_hash:
                return "unchanged"
            written = await _write(conn, entry, None if existing is None else existing.version)
            await append_events(
                conn, "memory.replaced" if live else "memory.stored", [written], now
            )
            if existing is None or not live or existing.category != entry.category:
                # last: the capacity lock (see outbox.capacity_usage)
                usage = await capacity_usage(conn, written, now, without_itself=True)
                policy.check_capacity(entry.category, entry.user_id, usage)
        return "replaced" if live else "created"


def _json_line(raw: bytes) -> object:
    """One NDJSON line as JSON, held to the same checks as a JSON body (no NUL character,
    bounded nesting: ``validation.check_json``)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"not valid JSON: {e}", field="line") from None
    check_json(obj, "")
    return obj


async def _write(conn: asyncpg.Connection, entry: MemoryEntry, found: int | None) -> MemoryEntry:
    """``outbox.write_entry_if``; ``Conflict`` if another writer created the identity since
    it was read (nothing is written; the caller may retry)."""
    written = await write_entry_if(conn, entry, found)
    if written is None:
        raise Conflict(f"memory entry {entry.key!r} was written concurrently; retry", field="key")
    return written


async def _take_identity(conn: asyncpg.Connection, entry: MemoryEntry, now: datetime) -> int | None:
    """An edit forced private moves the entry to the user's identity: refuse if a live
    entry is already there (``Conflict``). Returns the version of the (expired) row there,
    locked, or None if there is none."""
    row = await conn.fetchrow(
        "SELECT version, (expires_at IS NULL OR expires_at > $5) AS live FROM memory_entries "
        "WHERE account_id = $1 AND agent_id = $2 AND owner = $3 AND key = $4 FOR UPDATE",
        entry.account_id,
        entry.agent_id,
        entry.owner,
        entry.key,
        now,
    )
    if row is not None and row["live"]:
        raise Conflict(
            f"this content must be private to {entry.user_id}, who already has an entry "
            f"under {entry.key!r}",
            field="content",
        )
    return None if row is None else int(row["version"])
