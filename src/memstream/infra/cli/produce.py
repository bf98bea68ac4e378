"""``memstream produce``: JSON lines of messages into the journal of a running memstream.

Each line is one message object with ``account_id``, ``agent_id``, ``thread_id`` and the
message fields (``role``, ``content``, …, optional ``user_id``). Lines are validated
locally first (a bad line is reported by number and skipped, never sent), then sent in
order per thread through the admin append route, so the journal assigns offsets exactly as
the lines order them. The exit status is non-zero if any line failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import httpx
import orjson

from memstream.agents_ctx.validation import check_id, parse_message
from memstream.errors import InvalidRequest, MemstreamError

BATCH = 500


@dataclass
class LineError:
    line: int
    field: str | None
    message: str


@dataclass
class Batch:
    account_id: str
    agent_id: str
    thread_id: str
    user_id: str | None
    lines: list[int] = field(default_factory=list)
    messages: list[dict[str, object]] = field(default_factory=list)

    def key(self) -> tuple[str, str, str, str | None]:
        return (self.account_id, self.agent_id, self.thread_id, self.user_id)


def parse_lines(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, object] | LineError]]:
    """Validate each line; yields (line number, message dict) or (line number, LineError)."""
    for n, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            yield n, LineError(n, None, f"not JSON: {e}")
            continue
        try:
            if not isinstance(obj, dict):
                raise InvalidRequest("a line must be a JSON object", field="line")
            for name in ("account_id", "agent_id", "thread_id"):
                check_id(obj.get(name), name)
            if obj.get("user_id") is not None:
                check_id(obj.get("user_id"), "user_id")
            parse_message(obj)
        except InvalidRequest as e:
            yield n, LineError(n, e.field, e.message)
            continue
        yield n, obj


def batches(parsed: Iterable[tuple[int, dict[str, object]]]) -> Iterator[Batch]:
    """Consecutive lines of one thread (and user) form a batch of at most ``BATCH``."""
    cur: Batch | None = None
    for n, obj in parsed:
        user = obj.get("user_id")
        b = Batch(
            str(obj["account_id"]),
            str(obj["agent_id"]),
            str(obj["thread_id"]),
            str(user) if user is not None else None,
        )
        if cur is None or cur.key() != b.key() or len(cur.messages) >= BATCH:
            if cur is not None:
                yield cur
            cur = b
        msg = {
            k: v
            for k, v in obj.items()
            if k not in ("account_id", "agent_id", "thread_id", "user_id")
        }
        cur.lines.append(n)
        cur.messages.append(msg)
    if cur is not None:
        yield cur


async def send(client: httpx.AsyncClient, batch: Batch) -> None:
    resp = await client.post(
        "/admin/append",
        content=orjson.dumps(
            {
                "account_id": batch.account_id,
                "agent_id": batch.agent_id,
                "thread_id": batch.thread_id,
                "user_id": batch.user_id,
                "messages": batch.messages,
            }
        ),
        headers={"content-type": "application/json"},
    )
    if resp.status_code >= 400:
        try:
            err = resp.json()["error"]
        except (ValueError, KeyError, TypeError):
            err = {"message": resp.text, "code": "http_" + str(resp.status_code)}
        raise MemstreamError(f"{err.get('code')}: {err.get('message')}", field=err.get("field"))
