"""``memory_store`` for a group of concurrent calls of one account, in one transaction (group
commit): the Postgres side of :class:`~memstream.agents_ctx.memory.group_commit.GroupCommit`.

One transaction, five statements whatever the group's size: lock the group's identities
(``FOR UPDATE``, in sorted order), write every new or replaced row (one conditional upsert),
append their outbox events (one insert), take the capacity locks of the categories that
need room and count them (``memstream_capacity_counts``, migration 0012), commit. So the
part serialised on a category's capacity lock (the count and the commit with its fsync) is
paid once per group instead of once per store.

Guarantees (the same as one store at a time, see ``store.py``):

- **All or nothing, and never a different answer.** :func:`store_group` commits only if
  every call of the group gets the outcome it would get run alone in some order: every
  conditional write landed (no identity was created by another transaction in between)
  and every category that needed room is within its limits once the group's rows are
  written (:func:`policy.group_fits`). A group holding a replace that moves an entry to
  another category always runs one by one (the rarer case; it keeps that argument simple). Otherwise it rolls back and returns ``None``: the
  caller then runs the calls one by one, which refuses exactly the ones past a limit.
- A group never holds the same identity twice (the batcher's ``conflict_key``).
- Row locks are taken before the capacity locks, as every writer does, and the capacity
  locks in one sorted order: no deadlock with single stores, edits or imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

import asyncpg

from memstream.agents_ctx.memory import policy
from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    NEXT_VERSION,
    UPSERT_SET,
    append_typed_events,
    entry_of_row,
)
from memstream.schemas.events import MemoryEventType
from memstream.schemas.records import Caller, Category, MemoryEntry

GroupStatus = Literal["created", "unchanged", "replaced"]

Identity = tuple[str, str, str]
"""(agent, owner, key) of an entry inside one account."""

# The group's identities, locked in the order given (sorted by the caller): one primary-key
# lookup each. $1 account, $2/$3/$4 agents/owners/keys.
_LOCK_IDENTITIES: Final = f"""
SELECT e.* FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(agent, owner, key, n)
CROSS JOIN LATERAL (
    SELECT {ENTRY_COLUMNS} FROM memory_entries AS m
    WHERE m.account_id = $1 AND m.agent_id = u.agent AND m.owner = u.owner AND m.key = u.key
    FOR UPDATE) AS e
ORDER BY u.n
"""

# Many ``outbox.write_entry_if`` in one statement. The version column of a proposed row
# carries the version read (the row is locked: the update applies) or, for an identity that
# was absent, a fresh version (a conflict then means another transaction created it in
# between: no version equals a fresh one, so the row is not written and not returned).
_WRITE_MANY: Final = f"""
INSERT INTO memory_entries ({ENTRY_COLUMNS})
SELECT a, g, o, k, c, cat, vis, imp, uid, h, exp, cr, up, rc, lr, COALESCE(found, {NEXT_VERSION})
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
            $8::float8[], $9::text[], $10::text[], $11::timestamptz[], $12::timestamptz[],
            $13::timestamptz[], $14::int8[], $15::timestamptz[], $16::int8[])
    WITH ORDINALITY AS u(a, g, o, k, c, cat, vis, imp, uid, h, exp, cr, up, rc, lr, found, n)
ORDER BY n
ON CONFLICT (account_id, agent_id, owner, key) DO UPDATE SET
{UPSERT_SET}
    version = {NEXT_VERSION}
WHERE memory_entries.version = EXCLUDED.version
RETURNING {ENTRY_COLUMNS}
"""


def identity(caller: Caller, req: policy.StoreRequest) -> Identity:
    return (caller.agent_id, req.owner, req.key)


@dataclass(frozen=True, slots=True)
class Split:
    """The group was rolled back (nothing written): the calls at ``alone`` (indexes into
    the group) must run one by one; the others may be tried again as a group. Empty when
    another transaction created one of the identities meanwhile (a retry reads it)."""

    alone: frozenset[int]


async def store_group(
    conn: asyncpg.Connection,
    calls: Sequence[tuple[Caller, policy.StoreRequest]],
    now: datetime,
) -> list[tuple[GroupStatus, MemoryEntry]] | Split:
    """Store ``calls`` (one account, distinct identities, already checked) in one
    transaction on ``conn``: the outcome of each call in order, or a :class:`Split`
    (nothing written; see the module docstring)."""
    try:
        return await _store_group(conn, calls, now)
    except _Rollback as e:
        return e.split


class _Rollback(Exception):
    """Roll the group back (not an error of any call)."""

    def __init__(self, alone: Iterable[int] = ()) -> None:
        super().__init__()
        self.split = Split(frozenset(alone))


async def _store_group(
    conn: asyncpg.Connection,
    calls: Sequence[tuple[Caller, policy.StoreRequest]],
    now: datetime,
) -> list[tuple[GroupStatus, MemoryEntry]]:
    account = calls[0][0].account_id
    assert all(c.account_id == account for c, _ in calls)
    idents = [identity(c, r) for c, r in calls]
    order = sorted(idents)
    async with conn.transaction():
        rows = await conn.fetch(
            _LOCK_IDENTITIES,
            account,
            [i[0] for i in order],
            [i[1] for i in order],
            [i[2] for i in order],
        )
        found = {(r["agent_id"], r["owner"], r["key"]): entry_of_row(r) for r in rows}
        out: list[tuple[GroupStatus, MemoryEntry] | None] = [None] * len(calls)
        writes: list[tuple[int, MemoryEntry, int | None, MemoryEventType]] = []
        rooms: list[tuple[int, str, Category, str | None]] = []
        moves: list[int] = []
        for n, ((caller, req), ident) in enumerate(zip(calls, idents, strict=True)):
            existing = found.get(ident)
            action, needs_room = policy.plan_store(req, existing, now)
            if action == "unchanged":
                assert existing is not None
                out[n] = ("unchanged", existing)
                continue
            if action == "replace":
                assert existing is not None
                if needs_room:  # a move to another category: one by one (policy.group_fits)
                    moves.append(n)
                entry = policy.replaced_entry(existing, req, now, version=0)
            else:
                entry = policy.new_entry(req, account, caller.agent_id, now, version=0)
            typ: MemoryEventType = "memory.replaced" if action == "replace" else "memory.stored"
            writes.append((n, entry, None if existing is None else existing.version, typ))
            if needs_room:
                rooms.append((n, caller.agent_id, req.category, req.user_id))
        if moves:
            raise _Rollback(moves)
        if writes:
            written = await _write_many(conn, [(e, v) for _, e, v, _ in writes])
            if len(written) != len(writes):
                raise _Rollback()  # another transaction created one of the identities
            events: list[tuple[MemoryEventType, MemoryEntry]] = []
            for n, entry, _, typ in writes:
                row = written[(entry.agent_id, entry.owner, entry.key)]
                out[n] = ("replaced" if typ == "memory.replaced" else "created", row)
                events.append((typ, row))
            await append_typed_events(conn, events, now)
        if rooms:
            full = await _full(conn, account, [(a, c, u) for _, a, c, u in rooms], now)
            if full:  # the stores that needed room there run one by one
                raise _Rollback(n for n, a, c, _ in rooms if (a, c) in full)
    done = [o for o in out if o is not None]
    assert len(done) == len(calls)
    return done


async def _write_many(
    conn: asyncpg.Connection, rows: Sequence[tuple[MemoryEntry, int | None]]
) -> dict[Identity, MemoryEntry]:
    es = [e for e, _ in rows]
    written = await conn.fetch(
        _WRITE_MANY,
        [e.account_id for e in es],
        [e.agent_id for e in es],
        [e.owner for e in es],
        [e.key for e in es],
        [e.content for e in es],
        [e.category for e in es],
        [e.visibility for e in es],
        [e.importance for e in es],
        [e.user_id for e in es],
        [e.content_hash for e in es],
        [e.expires_at for e in es],
        [e.created_at for e in es],
        [e.updated_at for e in es],
        [e.recall_count for e in es],
        [e.last_recalled_at for e in es],
        [v for _, v in rows],
    )
    entries = [entry_of_row(r) for r in written]
    return {(e.agent_id, e.owner, e.key): e for e in entries}


async def _full(
    conn: asyncpg.Connection,
    account: str,
    rooms: Sequence[tuple[str, Category, str | None]],
    now: datetime,
) -> set[tuple[str, Category]]:
    """Take the capacity locks of ``rooms``' (agent, category) pairs; the pairs past a
    limit with the group's rows written (``policy.group_fits``)."""
    counts = await conn.fetch(
        "SELECT o_agent, o_category, o_user, o_count FROM memstream_capacity_counts($1, $2, $3, $4)",
        account,
        [a for a, _, _ in rooms],
        [c for _, c, _ in rooms],
        now,
    )
    per_group: dict[tuple[str, str], dict[str | None, int]] = {}
    for r in counts:
        per_group.setdefault((r["o_agent"], r["o_category"]), {})[r["o_user"]] = int(r["o_count"])
    users: dict[tuple[str, Category], set[str]] = {}
    for agent, cat, user in rooms:
        users.setdefault((agent, cat), set()).update([user] if user is not None else [])
    return {
        (agent, cat)
        for (agent, cat), authors in users.items()
        if not policy.group_fits(cat, per_group.get((agent, cat), {}), authors)
    }
