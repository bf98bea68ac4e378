"""Read-your-writes: ``after`` on ``journal/search`` and ``memory/recall``.

A write answers with a ``position`` (an append: the journal seq of its last message; a memory
store: the entry version). A read given ``after=<position>`` waits, at most
``Settings.read_your_writes_timeout_s``, until the projection it reads has applied that
position, else answers ``409 not_ready`` with the position applied so far (see
:mod:`memstream.projections.positions` for what is recorded where).

- Search: the journal record at seq ``after`` names its thread; the wait is on that thread's
  watermark. A seq of another account or agent, or past the journal's end, is rejected
  (``invalid_request``, field ``after``): a caller cannot probe other tenants' positions.
- Recall: the wait is on the caller's agent's watermark.
"""

from __future__ import annotations

from memstream.agents_ctx.services import Services
from memstream.errors import InvalidRequest, NotReady
from memstream.projections.positions import memory_position_key, thread_position_key
from memstream.schemas.events import DecodeError, decode
from memstream.schemas.records import Caller

__all__ = ["check_after", "wait_for_memory", "wait_for_messages"]


def check_after(value: object) -> int | None:
    """``None`` when absent; else a positive integer, or ``InvalidRequest(field="after")``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest("after must be a non-negative integer position", field="after")
    return value


async def wait_for_messages(svc: Services, caller: Caller, after: object) -> None:
    position = check_after(after)
    if not position:
        return
    journal = svc.need_journal()
    rows = await journal.read_seq(position - 1, 1)
    if not rows or rows[0][0] != position:
        raise InvalidRequest(f"no journal position {position}", field="after")
    try:
        env = decode(rows[0][1])
    except DecodeError:
        raise InvalidRequest(f"no message at journal position {position}", field="after") from None
    if (env.account_id, env.agent_id) != (caller.account_id, caller.agent_id) or not env.thread_id:
        raise InvalidRequest(f"no journal position {position} for this agent", field="after")
    if svc.positions is None:
        raise NotReady("transcript search positions are not tracked in this process", position=0)
    key = thread_position_key(env.account_id, env.agent_id, env.thread_id)
    await svc.positions.messages.wait_for(key, position, svc.settings.read_your_writes_timeout_s)


async def wait_for_memory(svc: Services, caller: Caller, after: object) -> None:
    position = check_after(after)
    if not position:
        return
    if svc.positions is None:
        raise NotReady("memory index positions are not tracked in this process", position=0)
    key = memory_position_key(caller.account_id, caller.agent_id)
    await svc.positions.memory.wait_for(key, position, svc.settings.read_your_writes_timeout_s)
