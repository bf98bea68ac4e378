"""Redis key layout for per-thread coordination and derived state.

Every key of a thread carries the hash tag ``{account/agent/thread}`` (``ThreadRef.key``), so
in a Redis Cluster a thread's cached summary, lock, counters, guard, watermark and claims all
live on one slot (Lua scripts touching several of them stay legal). Everything here is
derived or coordination state: wiping Redis never changes what the model sees.
"""

from __future__ import annotations

from memstream.schemas.records import ThreadRef

PREFIX = "ms"


def _k(ref: ThreadRef, name: str) -> str:
    return f"{PREFIX}:{{{ref.key}}}:{name}"


def summary_cache(ref: ThreadRef) -> str:
    """The cached summary JSON (one hour)."""
    return _k(ref, "summary")


def summary_lock(ref: ThreadRef) -> str:
    """The summarization lock (with expiry)."""
    return _k(ref, "sumlock")


def counters(ref: ThreadRef) -> str:
    """Hash with the two threshold counters, ``tokens`` and ``messages`` since the summary,
    and the counters processor's count mark: ``last`` (highest offset counted) and ``gaps``
    (offsets below it not seen yet), so a message is counted once without a key of its own."""
    return _k(ref, "counters")


def guard(ref: ThreadRef) -> str:
    """The flush-and-summarize guard: holds the span end of the outstanding request."""
    return _k(ref, "sumguard")


def watermark(ref: ThreadRef) -> str:
    """The last offset covered by a written summary (-1: none). Messages at or below it are
    already summarized and never counted again (replays)."""
    return _k(ref, "summarized")


def message_claim(ref: ThreadRef, offset: int) -> str:
    """Per-message claim of the counters processor before the count mark (no longer written;
    read once for a thread whose counters have no mark yet, so an upgrade counts nothing
    twice; they expire on their own)."""
    return _k(ref, f"counted:{offset}")


def thread_base(ref: ThreadRef) -> str:
    """What every key of the thread starts with (``ms:{tag}:``): the batch count script
    (:mod:`memstream.infra.thread_state`) gets only this per thread and appends
    ``summarized``, ``counters`` (or a rebuild's ``counters.gN``) and, for a thread with no
    count mark yet, ``counted:<offset>`` itself, as the functions above do."""
    return _k(ref, "")


def flush_claim(ref: ThreadRef, start: int, end: int) -> str:
    """The pre-compaction flush's claim for the span ``start..end`` (once per span)."""
    return _k(ref, f"flushed:{start}-{end}")


def thread_base_of(key: str) -> str:
    """The :func:`thread_base` of one of a thread's keys (read up to its last ``}:``: the
    names after the tag never hold ``}``, the ids inside it may)."""
    return key[: key.rfind("}:") + 2]


THREAD_KEYS = f"{PREFIX}:{{*"
"""A SCAN ``MATCH`` pattern for the keys of every thread."""


def thread_pattern(ref: ThreadRef) -> str:
    """A SCAN ``MATCH`` pattern for every key of one thread (glob characters escaped)."""
    tag = "".join("\\" + c if c in "*?[]\\" else c for c in ref.key)
    return f"{PREFIX}:{{{tag}}}:*"


def consumer_positions(group: str) -> str:
    """Hash ``<topic>:<partition>`` -> next offset: how far consumer group ``group`` has
    counted, written in the same script as the counts it covers (the counters processor).
    Unlike Kafka's committed offset it cannot run ahead of what Redis holds: a Redis that
    lost acknowledged writes (a kill under ``appendfsync everysec``) rolls it back with them."""
    return f"{PREFIX}:stream:{group}:next"
