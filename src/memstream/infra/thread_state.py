"""Redis adapter for a thread's coordination state: threshold counters and their count
mark, the flush-and-summarize guard, the summarized-offset watermark, and the summarization
lock.

Every multi-key change is one Lua script, so it is atomic. A thread's keys share its hash tag
(see :mod:`memstream.infra.redis_keys`); the batch scripts of the counters processor
(counting, guards) span the threads of a batch, which a single Redis/Valkey node (what
memstream connects to) allows and a Redis Cluster would not without splitting by slot.

Guarantees:

- :meth:`ThreadState.count_threads` counts many messages of many threads in one atomic
  script, each thread's in the given order: each message is counted once, whatever the
  redeliveries, replays and re-publications, and however late they come (the counters hash
  keeps the highest offset counted, ``last``, and the ranges below it not seen yet,
  ``gaps``: no per-message key, no expiry); a message at or below the watermark (already
  folded into a summary) is never counted at all. The counters and the mark live in one
  hash, so whatever replaces the counters (a rebuild's rename) replaces the mark with them.
- :meth:`ThreadState.claim_guards` is :meth:`ThreadState.claim_guard` for many spans, in
  order, in one round trip: the results are those of the same calls made one by one.
- :meth:`ThreadState.apply_summary` subtracts a summarized span from the counters, raises the
  watermark and clears the guard in one step, at most once per summarized offset;
  :meth:`ThreadState.apply_span` does it only where the span meets Valkey's own watermark
  (the summarizer's and the catch-up's way: :func:`memstream.streams.summary_catchup.apply`).
- The lock is released only by its holder (token compare) and expires on its own, so a
  crashed holder blocks a thread for at most the lock TTL.

Valkey away (connection, timeout, loading) surfaces as
:class:`~memstream.errors.RetryableInfraError` (a processor pauses and retries); a refusal
that would repeat (a script or data error) as :class:`~memstream.errors.PermanentInfraError`
(a processor dead-letters the record instead of stalling on it).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Final, Literal, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from memstream.errors import PermanentInfraError, RetryableInfraError
from memstream.infra import redis_keys
from memstream.infra.outage import is_transient
from memstream.schemas.records import ThreadRef

T = TypeVar("T")

# Count the messages of many threads, each thread's in order, in one atomic script.
#
# Per thread the counters hash holds, beside ``tokens`` and ``messages``, the high-water mark
# ``last`` (the highest offset counted) and ``gaps`` (offsets above the watermark not seen yet
# below ``last``, as ranges "a-b a-b ..."; usually absent). A message is counted when its
# offset is above ``last`` (a jump past ``last + 1`` records the skipped range as a gap) or
# falls in a gap (which it then leaves); anything else above the watermark is a duplicate.
# A thread's records come in offset order within one partition, so a redelivery or a
# re-publication is at or below ``last``; gaps cover what can come out of order: the tail
# of a thread's old partition after a partition-count change, read after its new partition's
# first records. One hash field per thread replaces the per-message claim keys (one key with
# a TTL per message, the bulk of this script's server time), and with no TTL a redelivery
# any time later (a fresh broker, a group reset) is still a no-op. At most ARGV[2] gap
# ranges are kept (the lowest go first; a message in a dropped range counts as a duplicate).
#
# A hash written by the per-message-claim version (counters but no ``last``) is read the old
# way until the first message its claims do not cover: from there on the thread's records
# are new, and ``last`` takes over (an upgrade never counts a redelivery twice).
#
# KEYS = one per thread, its key base (redis_keys.thread_base, "ms:{tag}:"; the script
# appends "summarized", the counters hash name ARGV[1] ("counters", or a rebuild's
# "counters.gN") and, for the legacy claims, "counted:<offset>" + ARGV[3] ("" or ".gN"), as
# redis_keys does). ARGV[4] = the consumer positions of the batch ("" for none), per
# partition "<topic>:<partition> <next offset> <expected>": the positions hash (the last key,
# redis_keys.consumer_positions) is first checked against <expected> (what the caller last
# wrote, or the group's committed offset; "-" for no check, "=" for no check and a position
# set rather than raised: a group that never committed, on a log that may have started again
# at 0 on a fresh broker): below it, or missing, Redis lost
# acknowledged writes, and the script changes nothing and answers "!" followed by
# "<topic>:<partition> <position or ->" per such partition. Otherwise the positions are raised
# to <next offset> with the counts, unless some thread's watermark is unknown (the caller
# counts those again, with the positions). ARGV[5..] = per thread its messages as
# one string "<offset> <tokens> <offset> <tokens> ...", led by "w<watermark> " when the
# caller loaded the thread's watermark from the summary store (set if Redis has none, as
# ``init_watermarks`` does, in the same step as the count). Two arguments per thread
# instead of three per message, and one script per batch, because packing a pipelined
# EVALSHA's arguments in redis-py cost ~3x the script's own run time (docs/streams.md).
# The script spans threads,
# so hash slots: memstream talks to one Redis/Valkey node (a Cluster client would have to
# split a batch by slot). Returns one string (a list reply costs a readline per element in
# redis-py), a part per thread joined by "|": "nowm" if its watermark is unknown, else
# "<wm> <tokens> <messages> <tokens after> <messages after> <statuses>" with the counters
# before its first message and after its last, and one status letter per message:
# c(ounted), d(uplicate), s(ummarized already) (the counters after message i follow by
# adding the counted ones up to i).
_COUNT_MANY: Final = """
local hname, maxgaps, csuffix, positions = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local out, unknown = {}, false
if positions ~= '' then
  local pk, behind = KEYS[#KEYS], {}
  local words = string.gmatch(positions, '%S+')
  for field in words do
    local _, expected = words(), words()
    if expected ~= '-' and expected ~= '=' then
      local cur = redis.call('HGET', pk, field)
      if not cur or tonumber(cur) < tonumber(expected) then
        behind[#behind + 1] = field .. ' ' .. (cur or '-')
      end
    end
  end
  if #behind > 0 then return '!' .. table.concat(behind, ' ') end
end
for j = 1, #ARGV - 4 do
  local base = KEYS[j]
  local msgs = ARGV[j + 4]
  local wm = redis.call('GET', base .. 'summarized')
  if string.byte(msgs, 1) == 119 then -- 'w': the watermark the caller loaded comes first
    local sp = string.find(msgs, ' ', 1, true)
    if not wm then
      wm = string.sub(msgs, 2, (sp or 0) - 1)
      redis.call('SET', base .. 'summarized', wm, 'EX', __WATERMARK_TTL__)
    end
    msgs = sp and string.sub(msgs, sp + 1) or ''
  end
  if not wm then
    out[j] = 'nowm'; unknown = true
  else
    wm = tonumber(wm)
    local ck = base .. hname
    local c = redis.call('HMGET', ck, 'tokens', 'messages', 'last', 'gaps')
    local t, m = tonumber(c[1]) or 0, tonumber(c[2]) or 0
    local last = tonumber(c[3])
    local legacy = false
    if last == nil then
      legacy = c[1] ~= false or c[2] ~= false
      last = wm
    elseif last < wm then
      last = wm
    end
    local ga, gb, ng, dirty = {}, {}, 0, false
    if c[4] and c[4] ~= '' then
      for a, b in string.gmatch(c[4], '(%d+)-(%d+)') do
        a, b = tonumber(a), tonumber(b)
        if b > wm then
          ng = ng + 1; ga[ng] = math.max(a, wm + 1); gb[ng] = b
        else
          dirty = true
        end
      end
    end
    local st, n, dt, dm = {}, 0, 0, 0
    local words = string.gmatch(msgs, '%S+')
    for w in words do
      local off, tok = tonumber(w), tonumber(words())
      if tok < 0 then tok = 0 end
      local s = 'd'
      n = n + 1
      if off <= wm then
        s = 's'
      elseif legacy then
        if redis.call('EXISTS', base .. 'counted:' .. w .. csuffix) == 0 then
          legacy = false; last = off; s = 'c'
        end
      elseif off > last then
        if off > last + 1 then
          ng = ng + 1; ga[ng] = last + 1; gb[ng] = off - 1; dirty = true
        end
        last = off; s = 'c'
      else
        for i = 1, ng do
          local a, b = ga[i], gb[i]
          if off >= a and off <= b then
            if a == b then
              table.remove(ga, i); table.remove(gb, i); ng = ng - 1
            elseif off == a then
              ga[i] = a + 1
            elseif off == b then
              gb[i] = b - 1
            else
              gb[i] = off - 1
              table.insert(ga, i + 1, off + 1); table.insert(gb, i + 1, b); ng = ng + 1
            end
            dirty = true; s = 'c'
            break
          end
        end
      end
      if s == 'c' then dt = dt + tok; dm = dm + 1 end
      st[n] = s
    end
    while ng > maxgaps do
      table.remove(ga, 1); table.remove(gb, 1); ng = ng - 1
    end
    if dm > 0 then
      redis.call('HSET', ck, 'tokens', t + dt, 'messages', m + dm, 'last', last)
    end
    if dirty then
      if ng > 0 then
        local parts = {}
        for i = 1, ng do parts[i] = ga[i] .. '-' .. gb[i] end
        redis.call('HSET', ck, 'gaps', table.concat(parts, ' '))
      else
        redis.call('HDEL', ck, 'gaps')
      end
    end
    out[j] = string.format('%d %d %d %d %d ', wm, t, m, t + dt, m + dm) .. table.concat(st)
  end
end
if positions ~= '' and not unknown then
  local pk = KEYS[#KEYS]
  local words = string.gmatch(positions, '%S+')
  for field in words do
    local next_offset, expected = words(), words()
    local cur = tonumber(redis.call('HGET', pk, field))
    if expected == '=' or cur == nil or cur < tonumber(next_offset) then
      redis.call('HSET', pk, field, next_offset)
    end
  end
end
return table.concat(out, '|')
"""

_CLAIM_GUARD: Final = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 2 end
return 0
"""

# _CLAIM_GUARD for many spans: KEYS = one guard per thread; ARGV = ttl, then per thread its
# span ends in order as one string "<up_to> <up_to> ...". Returns one digit per span (the
# _CLAIM_GUARD result), a part per thread joined by "|": the same as the calls one by one.
_CLAIM_GUARDS: Final = """
local ttl = ARGV[1]
local out = {}
for j = 1, #KEYS do
  local k, st, n = KEYS[j], {}, 0
  for up in string.gmatch(ARGV[j + 1], '%S+') do
    n = n + 1
    if redis.call('SET', k, up, 'NX', 'EX', ttl) then
      st[n] = '1'
    elseif redis.call('GET', k) == up then
      st[n] = '2'
    else
      st[n] = '0'
    end
  end
  out[j] = table.concat(st)
end
return table.concat(out, '|')
"""

# A summarized span first..last (ARGV[1], ARGV[2]) applied only where it meets Valkey's own
# watermark: {1, wm} applied; {0, wm} already (wm >= last: the guard is cleared); {2, wm}
# Valkey is behind first - 1 (it lost an earlier summary: the caller adds wm+1..first-1);
# {3, wm} Valkey is inside the span (the caller subtracts only wm+1..last). An unknown
# watermark (no key), or no ``first`` (ARGV[1] empty: ``apply_summary``), applies the span as
# given.
_APPLY_SPAN: Final = """
local first = tonumber(ARGV[1])
local last = tonumber(ARGV[2])
local cur = redis.call('GET', KEYS[2])
local wm = tonumber(cur or '-1')
if wm >= last then
  local g = redis.call('GET', KEYS[3])
  if g and tonumber(g) <= last then redis.call('DEL', KEYS[3]) end
  return {0, wm}
end
if cur and first and wm < first - 1 then return {2, wm} end
if cur and first and wm > first - 1 then return {3, wm} end
local g = redis.call('GET', KEYS[3])
if g and tonumber(g) <= last then redis.call('DEL', KEYS[3]) end
redis.call('SET', KEYS[2], last, 'EX', ARGV[5])
local c = redis.call('HMGET', KEYS[1], 'tokens', 'messages')
local t = math.max(0, (tonumber(c[1]) or 0) - tonumber(ARGV[3]))
local m = math.max(0, (tonumber(c[2]) or 0) - tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'tokens', t, 'messages', m)
return {1, wm}
"""

_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Extend the summarization lock only if ARGV[1] still holds it (the holder's lease renewal).
_RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class SpanOutcome:
    """What :meth:`ThreadState.apply_span` did. ``status``: ``applied``; ``already`` (Valkey's
    watermark is at or past the span's end: nothing subtracted, the guard cleared);
    ``behind`` (the watermark is before the span's start: Valkey lost an earlier summary,
    whose messages ``watermark + 1 .. first - 1`` must be subtracted with it); ``inside``
    (the watermark is within the span: only ``watermark + 1 .. last`` are to subtract).
    ``watermark``: Valkey's watermark before the call (-1 if unknown)."""

    status: Literal["applied", "already", "behind", "inside"]
    watermark: int


_SPAN_OUTCOMES: Final[dict[int, Literal["applied", "already", "behind", "inside"]]] = {
    0: "already",
    1: "applied",
    2: "behind",
    3: "inside",
}

#: How long the watermark is kept; on expiry it is reloaded from the summary store.
WATERMARK_TTL_S: Final = 7 * 24 * 3600

#: The counters hash's name under a thread's key base (``redis_keys.counters``).
COUNTERS: Final = "counters"
#: Gap ranges kept per thread (see ``_COUNT_MANY``); more means records far out of order.
MAX_GAPS: Final = 32

CountStatus = Literal["counted", "duplicate", "summarized", "no_watermark"]
_LETTER: Final[dict[str, CountStatus]] = {"c": "counted", "d": "duplicate", "s": "summarized"}


@dataclass(frozen=True, slots=True)
class ConsumerPositions:
    """What a counted batch reaches, per partition of consumer group ``group``'s input:
    ``(topic, partition) -> next offset`` (the batch's highest offset + 1)."""

    group: str
    next_offsets: Mapping[tuple[str, int], int]
    #: per partition, the position Redis must hold at least (what this consumer last wrote,
    #: or the group's committed offset at assignment); a partition left out is not checked
    expected: Mapping[tuple[str, int], int]
    #: partitions whose position is set to this batch's rather than raised (the group never
    #: committed them: what Redis holds may count a log a fresh broker started again at 0)
    reset: frozenset[tuple[str, int]] = frozenset()


class PositionsBehind(Exception):  # noqa: N818 - an outcome the caller acts on
    """Redis holds less than :attr:`ConsumerPositions.expected` for ``behind`` (``(topic,
    partition) -> its position, None if it has none``): it lost acknowledged writes. Nothing
    was counted; read those partitions again from there."""

    def __init__(self, behind: Mapping[tuple[str, int], int | None]) -> None:
        super().__init__(f"redis lost counted positions: {dict(behind)}")
        self.behind = dict(behind)


#: One thread's messages for :meth:`ThreadState.count_threads`: ``(offset, tokens)``, in order.
Steps = Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class CountResult:
    """Outcome of counting one message: the two counters after this step, and the watermark
    (last summarized offset, -1 for none)."""

    status: CountStatus
    tokens: int
    messages: int
    watermark: int


@dataclass(frozen=True, slots=True)
class ThreadCount:
    """One thread's outcome of :meth:`ThreadState.count_threads`: the counters before its
    first message and after its last, and one status letter per message (``c`` counted,
    ``d`` duplicate, ``s`` at or below the watermark). ``known`` is False when Redis has no
    watermark for the thread (then nothing was counted: load it, count again)."""

    known: bool
    watermark: int
    tokens: int
    messages: int
    tokens_after: int
    messages_after: int
    statuses: str

    def results(self, steps: Steps) -> list[CountResult]:
        """Per message: its status and the counters after it."""
        if not self.known:
            return [CountResult("no_watermark", 0, 0, -1) for _ in steps]
        t, m, wm = self.tokens, self.messages, self.watermark
        out = []
        for (_, tokens), letter in zip(steps, self.statuses, strict=True):
            if letter == "c":
                t += max(0, tokens)
                m += 1
            out.append(CountResult(_LETTER[letter], t, m, wm))
        return out


_UNKNOWN: Final = ThreadCount(False, -1, 0, 0, 0, 0, "")


def _thread_count(text: str) -> ThreadCount:
    if text == "nowm":
        return _UNKNOWN
    wm, t, m, t1, m1, statuses = text.split(" ")
    return ThreadCount(True, int(wm), int(t), int(m), int(t1), int(m1), statuses)


def _positions_of(text: str) -> dict[tuple[str, int], int | None]:
    words = text.split(" ")
    out: dict[tuple[str, int], int | None] = {}
    for field, position in zip(words[::2], words[1::2], strict=True):
        topic, _, partition = field.rpartition(":")
        out[(topic, int(partition))] = None if position == "-" else int(position)
    return out


async def _call(fn: Callable[[], Awaitable[T]], doing: str) -> T:
    try:
        return await fn()
    except RedisError as e:
        # Valkey away (connection, timeout, loading): retry; a script or data error
        # (ResponseError, DataError) would fail the same way again: the record's fault
        if is_transient(e):
            raise RetryableInfraError(f"redis failed while {doing}: {e}") from e
        raise PermanentInfraError(f"redis refused {doing}: {e}") from e


class ThreadState:
    """The Redis half of thread memory (counters processor and summarizer share it)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._count_many = redis.register_script(
            _COUNT_MANY.replace("__WATERMARK_TTL__", str(WATERMARK_TTL_S))
        )
        self._claim_guard = redis.register_script(_CLAIM_GUARD)
        self._claim_guards = redis.register_script(_CLAIM_GUARDS)
        self._apply_span = redis.register_script(_APPLY_SPAN)
        self._release = redis.register_script(_RELEASE)
        self._renew = redis.register_script(_RENEW)

    # --- counters ------------------------------------------------------------------------------
    async def count_threads(
        self,
        steps: Mapping[ThreadRef, Steps],
        *,
        counters_name: str = COUNTERS,
        legacy_claim_suffix: str = "",
        positions: ConsumerPositions | None = None,
        watermarks: Mapping[ThreadRef, int] | None = None,
    ) -> list[ThreadCount]:
        """Count each thread's ``(offset, tokens)`` steps, in order, into its counters; one
        :class:`ThreadCount` per thread, in ``steps`` order. ``watermarks``: the last
        summarized offset of threads whose watermark Redis did not know (loaded from the
        summary store), set where Redis still has none (:meth:`init_watermarks`) in the same
        step, so those threads count at once.

        One atomic script for all of them, in one round trip. Each message is counted once
        whatever the redeliveries (a per-thread high-water mark, with gaps for a thread's
        records that come out of order; see ``_COUNT_MANY``); a message at or below the
        watermark is never counted. ``counters_name`` names the hash under the thread's key
        base (a rebuild counts into ``counters.gN``, ``legacy_claim_suffix`` ``.gN``: the
        claims an older version wrote for it).

        ``positions``: the consumer positions the batch reaches, written in the same atomic
        step as the counts (raised, never lowered) unless a thread's watermark is unknown, so
        Redis holds exactly the counts of what lies below its positions, whatever it lost.
        First they are checked against ``positions.expected``: a partition Redis holds less
        of raises :class:`PositionsBehind`, and nothing is counted.
        """
        if not steps and (positions is None or not positions.next_offsets):
            return []
        keys = [redis_keys.thread_base(ref) for ref in steps]
        args: list[int | str] = [counters_name, MAX_GAPS, legacy_claim_suffix, ""]
        if positions is not None and positions.next_offsets:
            keys.append(redis_keys.consumer_positions(positions.group))
            want, reset = positions.expected, positions.reset
            args[3] = " ".join(
                f"{t}:{p} {o} {'=' if (t, p) in reset else want.get((t, p), '-')}"
                for (t, p), o in positions.next_offsets.items()
            )
        # map(str) over the flattened pairs: several times cheaper than an f-string per
        # message (it was 7 % of the processor's CPU); the script clamps negative tokens
        args += (" ".join(map(str, chain.from_iterable(s))) for s in steps.values())
        if watermarks:
            for i, ref in enumerate(steps, start=4):
                if ref in watermarks:
                    args[i] = f"w{int(watermarks[ref])} {args[i]}"

        raw = await _call(lambda: self._count_many(keys=keys, args=args), "counting messages")
        reply = raw.decode() if isinstance(raw, bytes) else str(raw)
        if reply.startswith("!"):
            raise PositionsBehind(_positions_of(reply[1:]))
        if not steps:
            return []
        return [_thread_count(part) for part in reply.split("|")]

    async def count_messages(
        self, items: Sequence[tuple[ThreadRef, int, int]]
    ) -> list[CountResult]:
        """Count each ``(ref, offset, tokens)``; results in ``items`` order
        (:meth:`count_threads` over the items grouped by thread, order kept in each)."""
        by_thread: dict[ThreadRef, list[int]] = {}
        for i, (ref, _, _) in enumerate(items):
            by_thread.setdefault(ref, []).append(i)
        groups = {ref: [(items[i][1], items[i][2]) for i in idx] for ref, idx in by_thread.items()}
        counts = await self.count_threads(groups)
        out: list[CountResult | None] = [None] * len(items)
        for (ref, idx), c in zip(by_thread.items(), counts, strict=True):
            for i, r in zip(idx, c.results(groups[ref]), strict=True):
                out[i] = r
        return [r for r in out if r is not None]

    async def count_mark(self, ref: ThreadRef) -> tuple[int | None, str]:
        """The thread's high-water mark (highest offset counted; None if the counters have
        none) and its gaps (``"a-b a-b"``; empty for none)."""
        raw = await _call(
            lambda: self._redis.hmget(redis_keys.counters(ref), ["last", "gaps"]),
            "reading the count mark",
        )
        last, gaps = cast(list[bytes | None], raw)
        return (int(last) if last is not None else None), (gaps or b"").decode()

    async def counters(self, ref: ThreadRef) -> tuple[int, int]:
        """``(tokens, messages)`` since the last summary."""
        raw = await _call(
            lambda: self._redis.hmget(redis_keys.counters(ref), ["tokens", "messages"]),
            "reading counters",
        )
        vals = cast(list[bytes | None], raw)
        return int(vals[0] or 0), int(vals[1] or 0)

    async def watermark(self, ref: ThreadRef) -> int:
        """The last summarized offset Redis knows (-1 if none or unknown)."""
        raw = await _call(
            lambda: self._redis.get(redis_keys.watermark(ref)), "reading the watermark"
        )
        return int(cast(bytes, raw)) if raw is not None else -1

    async def watermarks(self, refs: Sequence[ThreadRef]) -> list[int | None]:
        """Each thread's watermark as Valkey holds it (None: unknown), in ``refs`` order; one
        ``MGET`` (keys of many slots: one node, as the batch scripts)."""
        if not refs:
            return []
        raw = await _call(
            lambda: self._redis.mget([redis_keys.watermark(r) for r in refs]),
            "reading watermarks",
        )
        return [int(v) if v is not None else None for v in cast(list[bytes | None], raw)]

    async def init_watermarks(self, marks: Mapping[ThreadRef, int]) -> None:
        """:meth:`init_watermark` for each ``ref -> last summarized offset``, pipelined."""
        if not marks:
            return

        async def run() -> None:
            pipe = self._redis.pipeline(transaction=False)
            for ref, last in marks.items():
                pipe.set(redis_keys.watermark(ref), last, nx=True, ex=WATERMARK_TTL_S)
            await pipe.execute()

        await _call(run, "setting watermarks")

    async def init_watermark(self, ref: ThreadRef, last_summarized_offset: int) -> None:
        """Set the watermark if absent (loaded from the summary store after a Redis wipe)."""
        await _call(
            lambda: self._redis.set(
                redis_keys.watermark(ref), last_summarized_offset, nx=True, ex=WATERMARK_TTL_S
            ),
            "setting the watermark",
        )

    async def claim_guard(self, ref: ThreadRef, up_to_offset: int, ttl_s: int) -> bool:
        """Take the flush-and-summarize guard for the span ending at ``up_to_offset``.

        True if taken now, or already held for this very offset (a redelivered crossing
        message re-publishes its idempotent request); False if another span holds it.
        """
        res = await _call(
            lambda: self._claim_guard(keys=[redis_keys.guard(ref)], args=[up_to_offset, ttl_s]),
            "taking the summary guard",
        )
        return int(cast(int, res)) > 0

    async def claim_guards(self, spans: Sequence[tuple[ThreadRef, int]], ttl_s: int) -> list[bool]:
        """:meth:`claim_guard` for each ``(ref, up_to_offset)``, in order: one script for all
        (each thread's spans in the given order), the same results as the calls one by one."""
        if not spans:
            return []
        by_thread: dict[ThreadRef, list[int]] = {}
        for i, (ref, _) in enumerate(spans):
            by_thread.setdefault(ref, []).append(i)
        keys = [redis_keys.guard(ref) for ref in by_thread]
        args: list[int | str] = [ttl_s]
        args += (" ".join(str(spans[i][1]) for i in idx) for idx in by_thread.values())
        raw = await _call(lambda: self._claim_guards(keys=keys, args=args), "taking summary guards")
        reply = raw.decode() if isinstance(raw, bytes) else str(raw)
        out = [False] * len(spans)
        for idx, digits in zip(by_thread.values(), reply.split("|"), strict=True):
            for i, d in zip(idx, digits, strict=True):
                out[i] = d != "0"
        return out

    async def apply_summary(
        self, ref: ThreadRef, last_offset: int, tokens: int, messages: int
    ) -> bool:
        """Subtract a summarized span, raise the watermark, clear the guard. False if this
        offset was already applied (then only the guard is cleared)."""
        return (await self._apply(ref, None, last_offset, tokens, messages)).status == "applied"

    async def apply_span(
        self, ref: ThreadRef, first: int, last: int, tokens: int, messages: int
    ) -> SpanOutcome:
        """:meth:`apply_summary` for the span ``first..last``, applied only where it meets
        Valkey's own watermark (see :class:`SpanOutcome`): a summary whose span starts after
        a summary Valkey lost is not applied as if it followed the watermark. An unknown
        watermark applies the span as given."""
        return await self._apply(ref, first, last, tokens, messages)

    async def _apply(
        self, ref: ThreadRef, first: int | None, last: int, tokens: int, messages: int
    ) -> SpanOutcome:
        res = await _call(
            lambda: self._apply_span(
                keys=[redis_keys.counters(ref), redis_keys.watermark(ref), redis_keys.guard(ref)],
                args=[
                    "" if first is None else first,
                    last,
                    max(0, tokens),
                    max(0, messages),
                    WATERMARK_TTL_S,
                ],
            ),
            "resetting counters",
        )
        code, watermark = cast(list[int], res)
        return SpanOutcome(_SPAN_OUTCOMES[int(code)], int(watermark))

    async def claim_flush(self, ref: ThreadRef, start: int, end: int, ttl_s: int) -> bool:
        """Claim the pre-compaction flush of the span ``start..end``: True once per span
        (for ``ttl_s``), False for a retried or raced summary of the same span."""
        ok = await _call(
            lambda: self._redis.set(redis_keys.flush_claim(ref, start, end), 1, nx=True, ex=ttl_s),
            "claiming the flush",
        )
        return bool(ok)

    # --- lock ----------------------------------------------------------------------------------
    async def try_lock(self, ref: ThreadRef, ttl_s: float) -> str | None:
        """Take the summarization lock; its token, or None if someone else holds it."""
        token = secrets.token_hex(8)
        ok = await _call(
            lambda: self._redis.set(
                redis_keys.summary_lock(ref), token, nx=True, px=max(1, int(ttl_s * 1000))
            ),
            "taking the summary lock",
        )
        return token if ok else None

    async def renew_lock(self, ref: ThreadRef, token: str, ttl_s: float) -> bool:
        """Make the lock ``token`` holds expire ``ttl_s`` from now; False if it holds it no
        more (it expired and someone else may have it)."""
        res = await _call(
            lambda: self._renew(
                keys=[redis_keys.summary_lock(ref)], args=[token, max(1, int(ttl_s * 1000))]
            ),
            "renewing the summary lock",
        )
        return int(cast(int, res)) == 1

    async def unlock(self, ref: ThreadRef, token: str) -> bool:
        """Release the lock if ``token`` still holds it."""
        res = await _call(
            lambda: self._release(keys=[redis_keys.summary_lock(ref)], args=[token]),
            "releasing the summary lock",
        )
        return int(cast(int, res)) == 1
