"""What a model sees of a long, chatty conversation: facts said N messages ago, with and
without the context's recap.

Run: ``python bench/recap.py [--messages 400] [--seed 1] [--fact-rate 0.12]``.

Pure and in-process: it applies memstream's own rules to a synthetic conversation, turn by
turn, exactly as the pipeline would: the summary thresholds (``streams.thresholds``: 2,000
tokens or 50 messages), the progressive offline summary (512 tokens), the 20-message window
(``agents_ctx.context.assemble``) and the recap (``recap_of``, as ``?recap=true`` runs it). The summary
is taken as written the moment a threshold is crossed (the real summarizer is a few ms to a
few s behind, which only widens the gap).

The conversation: a user who chats in short lines and now and then states a fact with a
unique marker ("My booking reference is QX-4821."), and an assistant that answers in one to
three sentences. After every user message it checks, for each fact stated so far, whether
the marker is anywhere in the prompt (summary, recap, window), and prints the share seen by
how long ago it was said, and the prompt's size, for both layouts. It also times the recap's
digest (the CPU it adds to a context call).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime

from memstream.agents_ctx.context import (
    RECAP_MAX_MESSAGES,
    assemble,
    recap_of,
)
from memstream.infra.llm.summary import extractive_summary
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.limits import WINDOW_MESSAGES
from memstream.schemas.records import Message, Summary
from memstream.streams.thresholds import ThresholdCounters, after_summary, step

T = datetime(2026, 1, 1, tzinfo=UTC)
CHAT = [
    "ok", "sounds good", "thanks!", "and then?", "hmm, not sure", "go on", "makes sense",
    "what about the next step?", "can you say that shorter?", "right", "got it, thanks",
    "wait, why?", "cool", "let's keep going", "fine by me",
]  # fmt: skip
FACTS = [
    "My booking reference is {m}.", "I live at {m} street.", "My daughter's name is {m}.",
    "Our budget code is {m}.", "My employee number is {m}.", "The wifi password is {m}.",
    "I parked on level {m}.", "My flight is {m} tomorrow.",
]  # fmt: skip
REPLIES = [
    "Understood, I will keep that in mind while we plan the rest.",
    "Good question. The next step is to compare the options and pick one that fits.",
    "Sure. In short: we check availability first, then confirm, then send the details.",
    "That works. I can draft the message for you once you confirm the dates and times.",
]
BUCKETS = [(1, 20), (21, 50), (51, 100), (101, 10**9)]


def conversation(
    n: int, rnd: random.Random, fact_rate: float
) -> tuple[list[Message], dict[int, str]]:
    msgs: list[Message] = []
    facts: dict[int, str] = {}  # offset -> marker
    for i in range(n):
        if i % 2 == 0:
            if rnd.random() < fact_rate:
                marker = f"{rnd.choice('QXZKVW')}{rnd.choice('QXZKVW')}-{rnd.randint(1000, 9999)}"
                text = rnd.choice(FACTS).format(m=marker)
                facts[i] = marker
            else:
                text = rnd.choice(CHAT)
            role = "user"
        else:
            text = " ".join(rnd.sample(REPLIES, rnd.randint(1, 3)))
            role = "assistant"
        msgs.append(Message("a", "g", "t", i, f"m{i}", role, text, T, count_tokens(text)))  # type: ignore[arg-type]  # role from the two literals
    return msgs, facts


def main(args: argparse.Namespace) -> None:
    rnd = random.Random(args.seed)
    msgs, facts = conversation(args.messages, rnd, args.fact_rate)
    counters = ThresholdCounters()
    summary: Summary | None = None
    seen: dict[str, list[list[bool]]] = {
        "spec": [[] for _ in BUCKETS],
        "recap": [[] for _ in BUCKETS],
    }
    size: dict[str, list[int]] = {"spec": [], "recap": []}
    digest_s: list[float] = []
    summaries = 0
    for i, m in enumerate(msgs):
        counters, due = step(counters, m.token_count)
        if due:
            start = 0 if summary is None else summary.last_message_offset + 1
            span = msgs[start : i + 1]
            content = extractive_summary(
                summary.content if summary else None, span, 512, count_tokens
            )
            summary = Summary(
                summaries + 1, T, i, m.message_id, content, count_tokens(content), i + 1
            )
            counters = after_summary(counters, sum(x.token_count for x in span), len(span))
            summaries += 1
        if m.role != "user":
            continue
        window = msgs[max(0, i - 19) : i + 1]  # what the context reads: the newest 20
        newest = msgs[max(0, i + 1 - WINDOW_MESSAGES - RECAP_MAX_MESSAGES) : i + 1]
        t0 = time.perf_counter()
        recap = recap_of(summary, newest, WINDOW_MESSAGES)  # what ?recap=true reads
        if recap is not None:
            digest_s.append(time.perf_counter() - t0)
        for layout, ctx in (
            ("spec", assemble([], summary, window)),
            ("recap", assemble([], summary, window, 20, recap)),
        ):
            text = "\n".join(x.content for x in ctx.messages)
            size[layout].append(count_tokens(text))
            for offset, marker in facts.items():
                if offset >= i:
                    continue
                age = i - offset
                b = next(k for k, (lo, hi) in enumerate(BUCKETS) if lo <= age <= hi)
                seen[layout][b].append(marker in text)
    print(f"{args.messages} messages, {len(facts)} facts, {summaries} summaries")
    print(f"{'said N messages ago':<22} {'spec layout':>12} {'with recap':>12} {'ratio':>7}")
    for k, (lo, hi) in enumerate(BUCKETS):
        label = f"{lo}-{hi}" if hi < 10**9 else f"{lo}+"
        spec, recapped = seen["spec"][k], seen["recap"][k]
        if spec:
            before, after = sum(spec) / len(spec), sum(recapped) / len(recapped)
            ratio = f"{after / before:6.2f}x" if before else "      -"
            print(f"{label:<22} {before:12.0%} {after:12.0%} {ratio}   ({len(spec)} checks)")
    for layout in ("spec", "recap"):
        print(
            f"prompt tokens, {layout}: mean {statistics.mean(size[layout]):.0f}, max {max(size[layout])}"
        )
    cost = statistics.mean(size["recap"]) / statistics.mean(size["spec"])
    print(f"prompt tokens, recap / spec: {cost:.2f}x")
    if digest_s:
        digest_s.sort()
        print(
            f"recap digest: {len(digest_s)} of {len(size['spec'])} turns had a gap; "
            f"p50 {digest_s[len(digest_s) // 2] * 1000:.2f} ms, "
            f"p99 {digest_s[int(len(digest_s) * 0.99)] * 1000:.2f} ms of CPU"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fact-rate", type=float, default=0.12, help="share of user lines with a fact")
    main(ap.parse_args())
