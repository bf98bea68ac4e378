"""Access control for the agent surfaces, in one place: who may touch a thread, and which
agents may use the memory tools.

Every surface (HTTP routes, the MCP tools, the Python client through HTTP, the
pre-compaction flush) goes through this module; nothing else decides.

**Threads.** A thread opened by a user belongs to that user; a thread opened without a user
is shared by the agent. The owner is recorded once, when the thread's row is inserted in
Postgres (the authority, written before the journal append), and never changes. For any
other caller, and for a caller without a user, every route of someone's thread (context,
summary, append, delete, create, tool-call view, sub-agent delegation from it) answers
``NotFound`` exactly as for a thread that does not exist: nothing is revealed. Every user
reads and writes a shared thread, but only a call without a user (or an admin key) may
delete or erase it (``Forbidden`` naming ``thread_id``): one user cannot take it from all. A deleted
thread is ``NotFound`` on every route too, appending included (it is never silently
revived; ``POST .../threads`` with its id revives it explicitly, for its owner, unless it
was erased: an erased id is never used again).

The check is cheap: thread records are cached per thread (bounded). The owner never
changes, so a cached owner is never wrong; the ``deleted`` flag and the metadata are
refreshed after ``ttl_s`` (a delete made by another API process is seen within that time;
one made through this process at once).

Transcript search reads no single thread: it leaves out the agent's deleted threads
(:meth:`ThreadAccess.deleted_threads`, one Postgres query per agent, cached for ``ttl_s``
like the flag, dropped at once by a delete, revival or erasure through this process). Its
privacy rule between users is its own (``projections.messages``).

**Memory binding.** The three memory tools need the Memory capability bound to the agent
(``PUT /v1/agents/{id} {"memory": true}``): without it they raise
:class:`~memstream.errors.MemoryNotBound` (HTTP 403 ``memory_not_bound``), so no agent
memory is created from any path. Pinned facts still load without Memory.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Final, Protocol

from memstream.agents_ctx.validation import check_id
from memstream.errors import Conflict, Forbidden, MemoryNotBound, NotFound
from memstream.infra.accounts import Accounts, Thread
from memstream.schemas.records import Caller, JSONObject, ThreadRef

THREAD_CACHE_TTL_S: Final = 2.0
THREAD_CACHE_MAX: Final = 100_000
DELETED_CACHE_MAX: Final = 10_000
"""At most this many agents' deleted-thread sets kept (the oldest dropped first)."""


# --- pure rules ----------------------------------------------------------------------------
def may_use_thread(owner: str | None, user_id: str | None) -> bool:
    """A shared thread (no owner) is everyone's; an owned one is its owner's alone."""
    return owner is None or owner == user_id


def may_remove_thread(owner: str | None, caller: Caller) -> bool:
    """Who may delete or erase a thread they can read: its owner; for a shared thread, the
    agent acting without a user (the key that opened it); an admin key, any. A user may read
    and write a shared thread but not take it from every other user."""
    if caller.admin:
        return True
    return caller.user_id is None if owner is None else owner == caller.user_id


def shared_thread_refused(thread_id: str) -> Forbidden:
    return Forbidden(
        f"thread {thread_id!r} is shared by every user of the agent: only a call without a "
        "user, or an admin key, may delete or erase it",
        field="thread_id",
    )


def not_found(thread_id: str, field: str = "thread_id") -> NotFound:
    """The one answer for a thread the caller may not see: the same as for no thread."""
    return NotFound(f"no thread {thread_id!r}", field=field)


# --- threads --------------------------------------------------------------------------------
class ThreadAccess:
    """Every thread route's check, over the Postgres thread records (cached)."""

    def __init__(
        self,
        accounts: Accounts,
        *,
        ttl_s: float = THREAD_CACHE_TTL_S,
        max_size: int = THREAD_CACHE_MAX,
    ) -> None:
        self._accounts = accounts
        self._ttl = ttl_s
        self._max = max_size
        self._cache: OrderedDict[ThreadRef, tuple[Thread, float]] = OrderedDict()
        # (account, agent) -> (ids of its deleted threads, expiry), for transcript search
        self._deleted: OrderedDict[tuple[str, str], tuple[frozenset[str], float]] = OrderedDict()
        # bumped whenever a set is dropped: a read that overlapped the drop is not kept
        self._deleted_gen = 0

    def ref(self, caller: Caller, thread_id: object, field: str = "thread_id") -> ThreadRef:
        return ThreadRef(caller.account_id, caller.agent_id, check_id(thread_id, field))

    async def _record(self, ref: ThreadRef) -> Thread | None:
        hit = self._cache.get(ref)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        thread = await self._accounts.get_thread(ref)
        if thread is not None:
            self._remember(thread, now)
        return thread

    def _remember(self, thread: Thread, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        self._cache[thread.ref] = (thread, at + self._ttl)
        self._cache.move_to_end(thread.ref)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)

    async def readable(
        self, caller: Caller, ref: ThreadRef, field: str = "thread_id"
    ) -> Thread | None:
        """The thread if ``caller`` may read it; None if it was never opened (there is
        nothing to see). ``NotFound`` if it is someone else's or deleted."""
        thread = await self._record(ref)
        if thread is None:
            return None
        if thread.deleted or not may_use_thread(thread.owner, caller.user_id):
            raise not_found(ref.thread_id, field)
        return thread

    async def visible(self, caller: Caller, ref: ThreadRef) -> bool:
        """``readable`` as a yes/no (a thread with no record counts as shared)."""
        try:
            await self.readable(caller, ref)
        except NotFound:
            return False
        return True

    async def open(self, caller: Caller, ref: ThreadRef) -> tuple[Thread, bool]:
        """The thread an append goes to, opened for ``caller`` if it has no record yet.
        Returns (thread, created). ``NotFound`` if it is someone else's or deleted."""
        thread = await self._record(ref)
        created = False
        if thread is None:
            thread, created = await self._accounts.open_thread(ref, caller.user_id)
            self._remember(thread)
        if thread.deleted or not may_use_thread(thread.owner, caller.user_id):
            raise not_found(ref.thread_id)
        return thread, created

    async def open_as_operator(self, ref: ThreadRef, owner: str | None) -> tuple[Thread, bool]:
        """The operator's append (``memstream produce``): opened for ``owner`` if new; a
        deleted thread is still ``NotFound``. Messages of one user never go into another
        user's thread (``Conflict`` naming ``user_id``): search shows a thread to every user
        who wrote in it, so such a line would have shown the owner's whole thread to that
        user. Messages without a user may go into any thread."""
        thread = await self._record(ref)
        created = False
        if thread is None:
            thread, created = await self._accounts.open_thread(ref, owner)
            self._remember(thread)
        if thread.deleted:
            raise not_found(ref.thread_id)
        if owner is not None and thread.owner is not None and thread.owner != owner:
            raise Conflict(
                f"thread {ref.thread_id!r} belongs to user {thread.owner!r}; messages of "
                f"user {owner!r} cannot go into it",
                field="user_id",
            )
        return thread, created

    async def create(
        self, caller: Caller, ref: ThreadRef, metadata: JSONObject
    ) -> tuple[Thread, bool]:
        """``POST .../threads``: create, return the existing one, or revive a deleted one
        with ``metadata``, for its owner. ``NotFound`` (nothing changed) for someone else's.
        ``Conflict`` naming ``thread_id``, nothing changed, where the caller could see the
        thread but would not get what it asked for: an erased thread (never revived: the
        projections drop whatever it would write), or a shared thread asked for by a user
        (it stays shared, so every caller of the agent would read what the user writes)."""
        thread, created = await self._accounts.create_thread(ref, metadata, caller.user_id)
        if thread is None:
            record = await self._accounts.get_thread(ref)
            if record is None or not may_use_thread(record.owner, caller.user_id):
                raise not_found(ref.thread_id)
            if await self._accounts.thread_erased(ref):
                raise Conflict(
                    f"thread {ref.thread_id!r} was erased; its id cannot be used again",
                    field="thread_id",
                )
            raise Conflict(
                f"thread {ref.thread_id!r} is shared by every caller of the agent (it was "
                "opened without a user), so it cannot be this user's own: use another id",
                field="thread_id",
            )
        self._remember(thread)
        if not created:  # an existing thread: it may have been revived
            self._drop_deleted(ref)
        return thread, created

    def forget(self, ref: ThreadRef) -> None:
        """Drop the cached record of ``ref`` (erasure changed it behind this cache)."""
        self._cache.pop(ref, None)
        self._drop_deleted(ref)

    async def delete(self, caller: Caller, ref: ThreadRef) -> None:
        """Flag the thread deleted. ``NotFound`` if there is none the caller may read;
        ``Forbidden`` for a user's call on a shared thread (:func:`may_remove_thread`)."""
        thread = await self.readable(caller, ref)
        if thread is not None and not may_remove_thread(thread.owner, caller):
            raise shared_thread_refused(ref.thread_id)
        self._cache.pop(ref, None)
        try:
            if thread is None or not await self._accounts.delete_thread(ref):
                raise not_found(ref.thread_id)
        finally:
            self._drop_deleted(ref)

    async def deleted_threads(self, caller: Caller) -> frozenset[str]:
        """The ids of the caller's agent's deleted threads, which transcript search leaves
        out for every caller. One Postgres query (a partial index of the deleted rows),
        cached per agent for ``ttl_s``: a delete or revival by another API process is seen
        within that time, one through this process at once."""
        key = (caller.account_id, caller.agent_id)
        now = time.monotonic()
        hit = self._deleted.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        gen = self._deleted_gen
        ids = await self._accounts.deleted_threads(*key)
        if gen == self._deleted_gen:  # no delete or revival here while it was read
            self._deleted[key] = (ids, now + self._ttl)
            self._deleted.move_to_end(key)
            while len(self._deleted) > DELETED_CACHE_MAX:
                self._deleted.popitem(last=False)
        return ids

    def _drop_deleted(self, ref: ThreadRef) -> None:
        """The agent's deleted set may have changed: read it again at the next search."""
        self._deleted.pop((ref.account_id, ref.agent_id), None)
        self._deleted_gen += 1


# --- the Memory binding -----------------------------------------------------------------------
class MemoryBinding(Protocol):
    """Where the Memory capability is read (``Accounts``, cached briefly)."""

    async def memory_bound(self, account_id: str, agent_id: str) -> bool: ...


async def require_memory(binding: MemoryBinding, caller: Caller) -> None:
    """``MemoryNotBound`` unless the agent has the Memory capability bound."""
    if not await binding.memory_bound(caller.account_id, caller.agent_id):
        raise MemoryNotBound(
            f"agent {caller.agent_id!r} does not have Memory bound: the memory tools need "
            'PUT /v1/agents/{agent_id} {"memory": true}',
            field="agent_id",
        )
