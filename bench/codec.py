"""Bench: µs per envelope for the event codec, fast path vs the checked reference path.

Every stream processor pays ``decode`` (bytes → ``Envelope``) and usually ``message_of`` /
``entry_of`` (``data`` → ``Message`` / ``MemoryEntry``) per record, so these cap the
runtime. For each step this prints the time of:

- ``before``: the checked reference readers (``events._decode_checked`` after
  ``orjson.loads``, ``Message._from_dict_checked``, ``MemoryEntry._from_dict_checked``), which
  are the code these functions ran before the fast paths existed and still run for any input
  the fast path does not accept;
- ``after``: the public functions (``decode``, ``message_of``, ``entry_of``);
- ``orjson.loads`` alone, the floor under ``decode``.

Samples are interleaved (before, after, before, ...) and the minimum of ``--repeat`` runs is
shown, because the machine is shared. Run: ``python bench/codec.py [--n N] [--repeat R]``.
Not a test: it asserts nothing (the equivalence is tested in tests/unit/test_codec_fastpath.py).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from datetime import UTC, datetime

import orjson

from memstream.schemas import events
from memstream.schemas.records import MemoryEntry, Message, ToolCall

CONTENT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 chars, as bench/journal


def samples() -> tuple[bytes, bytes, bytes]:
    now = datetime(2026, 11, 29, 12, 0, 0, 123000, tzinfo=UTC)
    plain = Message(
        account_id="acct",
        agent_id="agent",
        thread_id="thread-1",
        offset=12,
        message_id="0190abcdef0123456789abcdef012345",
        role="user",
        content=CONTENT,
        created_at=now,
        token_count=40,
        seq=1234,
        user_id="u1",
    )
    with_calls = Message(
        account_id="acct",
        agent_id="agent",
        thread_id="thread-1",
        offset=13,
        message_id="0190abcdef0123456789abcdef012346",
        role="assistant",
        content="calling tools",
        created_at=now,
        token_count=12,
        seq=1235,
        tool_calls=(
            ToolCall("c1", "search", '{"q": "fox"}'),
            ToolCall("c2", "fetch", {"url": "https://example.com"}),
        ),
    )
    entry = MemoryEntry(
        "acct",
        "agent",
        "favourite_colour",
        "The user's favourite colour is green.",
        "user_profile",
        "private",
        0.8,
        "3f2a9c",
        now,
        now,
        user_id="u1",
        version=3,
    )
    return (
        events.encode(events.message_appended(plain, 1)),
        events.encode(events.message_appended(with_calls, 1)),
        events.encode(events.memory_event("memory.stored", entry, 5)),
    )


def best(fn: Callable[[], object], n: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=repeat)) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000, help="calls per sample")
    ap.add_argument("--repeat", type=int, default=7, help="samples per figure; min shown")
    args = ap.parse_args()
    plain, calls, memory = samples()
    loads = orjson.loads
    checked = events._decode_checked
    msg_ref = Message._from_dict_checked
    entry_ref = MemoryEntry._from_dict_checked
    env_plain, env_calls, env_mem = (
        events.decode(plain),
        events.decode(calls),
        events.decode(memory),
    )
    entry_data = env_mem.data["entry"]
    assert isinstance(entry_data, dict)
    cases: list[tuple[str, Callable[[], object], Callable[[], object], Callable[[], object]]] = [
        (
            "decode (message.appended)",
            lambda: loads(plain),
            lambda: checked(loads(plain)),
            lambda: events.decode(plain),
        ),
        (
            "message_of (plain)",
            lambda: None,
            lambda: msg_ref(env_plain.data),
            lambda: events.message_of(env_plain),
        ),
        (
            "message_of (2 tool calls)",
            lambda: None,
            lambda: msg_ref(env_calls.data),
            lambda: events.message_of(env_calls),
        ),
        (
            "entry_of (memory.stored)",
            lambda: None,
            lambda: entry_ref(entry_data),
            lambda: events.entry_of(env_mem),
        ),
        (
            "decode + message_of",
            lambda: loads(plain),
            lambda: msg_ref(checked(loads(plain)).data),
            lambda: events.message_of(events.decode(plain)),
        ),
        (
            "decode + entry_of",
            lambda: loads(memory),
            lambda: entry_ref(checked(loads(memory)).data["entry"]),  # type: ignore[arg-type]
            lambda: events.entry_of(events.decode(memory)),
        ),
    ]
    print(
        f"µs per envelope, min of {args.repeat} x {args.n:,} calls "
        f"(message envelope {len(plain)} B, memory envelope {len(memory)} B)"
    )
    print()
    print(f"{'step':<28}{'orjson':>9}{'before':>9}{'after':>9}{'speed-up':>10}")
    for name, floor, before, after in cases:
        b = a = f = float("inf")
        for _ in range(args.repeat):  # interleaved, so load shifts hit both alike
            b = min(b, best(before, args.n, 1))
            a = min(a, best(after, args.n, 1))
            f = min(f, best(floor, args.n, 1))
        floor_txt = f"{f:.2f}" if name.startswith("decode") else "-"
        print(f"{name:<28}{floor_txt:>9}{b:>9.2f}{a:>9.2f}{b / a:>9.1f}x")


if __name__ == "__main__":
    main()
