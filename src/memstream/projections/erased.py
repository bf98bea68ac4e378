"""``ErasedThreads`` and ``ErasedEntries``: what erasure removed, which no projection may
bring back.

Erasure deletes a thread's rows everywhere, but the ``journal`` topic in Kafka still holds
the thread's original ``message.appended`` events (see docs/owning-memory.md: the topic
keeps everything, by design, for rebuilds). A lagging projector, or ``replay messages``
from the topic, would write them again. Every write into the message projection therefore
goes through this registry (``MessageStore.write`` and ``write_journal_batch``, live and
replay generations alike), and drops the events of erased threads.

The authority is the ``erased_threads`` table in Postgres (erasure registers a thread
there before deleting anything); this is its in-process copy, loaded at start-up and
updated by erasures run in this process. A projector in another process reloads it every
``refresh_s`` seconds (``refresh``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import asyncpg
import orjson

from memstream.schemas.records import ThreadRef

Identity = tuple[str, str, str]


class ErasedThreads:
    def __init__(self, pool: asyncpg.Pool | None = None, *, refresh_s: float = 5.0) -> None:
        self._ids: set[Identity] = set()
        self._pool = pool
        self._refresh_s = refresh_s
        self._loaded_at = 0.0

    def add(self, refs: Iterable[ThreadRef]) -> None:
        self._ids.update((r.account_id, r.agent_id, r.thread_id) for r in refs)

    def __contains__(self, ident: object) -> bool:
        return ident in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def identities(self) -> list[Identity]:
        """Every erased (account, agent, thread) known here, sorted (a copy)."""
        return sorted(self._ids)

    async def load(self) -> int:
        """Read the registry from Postgres (adds; never forgets an erased thread)."""
        if self._pool is None:
            return len(self._ids)
        rows = await self._pool.fetch("SELECT account_id, agent_id, thread_id FROM erased_threads")
        self._ids.update((r["account_id"], r["agent_id"], r["thread_id"]) for r in rows)
        self._loaded_at = time.monotonic()
        return len(self._ids)

    async def refresh(self) -> None:
        """``load`` at most every ``refresh_s`` seconds (cheap to call per batch)."""
        if self._pool is not None and time.monotonic() - self._loaded_at >= self._refresh_s:
            await self.load()

    def keep_values(self, values: Sequence[bytes]) -> list[bytes]:
        """The raw journal envelopes not of an erased thread (all of them while nothing was
        erased: no parsing). Undecodable values are kept, for the caller to report."""
        if not self._ids:
            return list(values)
        out = []
        for v in values:
            try:
                obj = orjson.loads(v)
                ident = (obj.get("account_id"), obj.get("agent_id"), obj.get("thread_id"))
            except (orjson.JSONDecodeError, AttributeError):
                out.append(v)
                continue
            if ident not in self._ids:
                out.append(v)
        return out


EntryIdentity = tuple[str, str, str, str]


class ErasedEntries:
    """The memory entries erasure removed, by identity, with the version erased: the recall
    index drops any upsert at or below it (the ``memory`` topic still holds the entry's
    ``memory.stored`` events, so a replay would otherwise embed and index them again before
    reaching the delete). Authority: ``erased_entries`` in Postgres; this is its copy,
    loaded at start-up, updated by erasures in this process, reloaded every ``refresh_s``."""

    def __init__(self, pool: asyncpg.Pool | None = None, *, refresh_s: float = 5.0) -> None:
        self._versions: dict[EntryIdentity, int] = {}
        self._pool = pool
        self._refresh_s = refresh_s
        self._loaded_at = 0.0

    def add(self, identity: EntryIdentity, version: int) -> None:
        self._versions[identity] = max(version, self._versions.get(identity, version))

    def covers(self, identity: EntryIdentity, version: int) -> bool:
        """True when this state of the entry was erased (or an older one)."""
        erased = self._versions.get(identity)
        return erased is not None and version <= erased

    def __len__(self) -> int:
        return len(self._versions)

    async def load(self) -> int:
        if self._pool is None:
            return len(self._versions)
        rows = await self._pool.fetch(
            "SELECT account_id, agent_id, owner, key, version FROM erased_entries"
        )
        for r in rows:
            self.add((r["account_id"], r["agent_id"], r["owner"], r["key"]), int(r["version"]))
        self._loaded_at = time.monotonic()
        return len(self._versions)

    async def refresh(self) -> None:
        if self._pool is not None and time.monotonic() - self._loaded_at >= self._refresh_s:
            await self.load()
