"""Read-your-writes positions in Redis: the highest position each projection has applied,
per key, shared by every process (``memstream api`` reads what ``memstream worker`` applied).

Layout: one sorted set per (key, projection), ``ms:{<key>}:applied:<projection>``, holding
a single member ``p`` whose score is the position. The hash tag is the position key itself:
``account/agent/thread`` for transcript search (the same slot as the thread's other keys,
see :mod:`memstream.infra.redis_keys`), ``account/agent`` for the memory index.

Guarantees:

- **Monotonic**: a write is ``ZADD … GT``, so a mark never moves backwards, whatever the
  order in which processes (or a re-delivered batch) write. No script, no read-modify-write.
- **Cheap**: one pipelined round trip (not a MULTI) per :meth:`record` call, whatever the
  number of keys; each key's write is atomic on its own, which is all monotonicity needs.
- **Derived only**: a mark is written after its position was applied, so it can only be
  behind the truth. A lost or wiped key makes a read wait (and answer ``not_ready``), never
  answer early. Marks expire ``ttl_s`` after their last advance (idle keys do not pile up),
  give or take ``refresh_s``: a key's expiry is pushed back at most that often by one
  process (an hour, against a TTL of days), so a busy key costs one command a batch, not
  two (the pipeline's encoding and replies were ~4% of ``memstream up``'s loop under append
  load, half of it the ``EXPIRE``). A key Valkey lost is written without an expiry until
  then.
- Scores are doubles: positions are exact up to 2**53 (journal seqs and Postgres sequence
  values stay far below).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

import redis.asyncio as aioredis

__all__ = ["DEFAULT_TTL_S", "RedisPositions", "position_key"]

DEFAULT_TTL_S: Final = 7 * 24 * 3600
REFRESH_S: Final = 3600.0
"""How often one process pushes a key's expiry back (at most)."""
REMEMBERED: Final = 200_000
"""Keys whose last expiry push a process remembers (the oldest forgotten past it)."""
_MEMBER: Final = "p"


def position_key(projection: str, key: str, prefix: str = "ms") -> str:
    """The Redis key of ``key``'s mark in ``projection`` (``messages`` or ``memory``)."""
    return f"{prefix}:{{{key}}}:applied:{projection}"


class RedisPositions:
    """The :class:`~memstream.projections.positions.SharedPositions` adapter over Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        prefix: str = "ms",
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._refresh_s = refresh_s
        self._pushed: OrderedDict[str, float] = OrderedDict()  # key -> its last expiry push

    async def record(self, projection: str, marks: Mapping[str, int]) -> None:
        """Raise each key's mark to its position (never lower it); one round trip."""
        if not marks:
            return
        now = time.monotonic()
        pipe = self._redis.pipeline(transaction=False)
        pushed: list[str] = []
        for key, position in marks.items():
            rk = position_key(projection, key, self._prefix)
            pipe.zadd(rk, {_MEMBER: position}, gt=True)
            at = self._pushed.get(rk)
            if at is None or now - at >= self._refresh_s:
                pipe.expire(rk, self._ttl_s)
                pushed.append(rk)
        await pipe.execute()
        for rk in pushed:  # once Valkey has them
            self._pushed[rk] = now
            self._pushed.move_to_end(rk)
        while len(self._pushed) > REMEMBERED:
            self._pushed.popitem(last=False)

    async def get(self, projection: str, key: str) -> int | None:
        """``key``'s mark, or None when Redis has none."""
        score = await self._redis.zscore(position_key(projection, key, self._prefix), _MEMBER)
        return None if score is None else int(score)
