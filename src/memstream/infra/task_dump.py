"""What every asyncio task of the process is awaiting, for ``kill -USR2`` on a process that
seems stuck (``kill -USR1`` prints the threads' stacks, which show an event loop idle in
``epoll`` while a task waits on something that never comes).

Each task is printed with its whole await chain (coroutine inside coroutine down to the
future it waits on), not only its outermost frame as ``Task.print_stack`` does for a
suspended coroutine.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TextIO

__all__ = ["BEGIN", "END", "await_chain", "dump_tasks"]

BEGIN = "--- asyncio tasks (kill -USR2) ---"
END = "--- end of asyncio tasks ---"


def await_chain(awaitable: Any, waiter: object = None) -> list[str]:
    """The frames of ``awaitable`` and of what it awaits, outermost first, then the future
    (or other object) at the bottom of the chain: ``waiter`` when given (the future a task
    waits on; a C future's iterator at the bottom says nothing)."""
    out: list[str] = []
    seen = 0
    while awaitable is not None and seen < 200:
        seen += 1
        frame = next(
            (f for a in ("cr_frame", "gi_frame", "ag_frame") if (f := getattr(awaitable, a, None))),
            None,
        )
        if frame is not None:
            code = frame.f_code
            out.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        inner = next(
            (
                x
                for a in ("cr_await", "gi_yieldfrom", "ag_await")
                if (x := getattr(awaitable, a, None)) is not None
            ),
            None,
        )
        if inner is None and frame is None:
            out.append(f"  awaiting {awaitable if waiter is None else waiter!r}"[:400])
        awaitable = inner
    return out


def dump_tasks(file: TextIO | None = None) -> int:
    """Write every task of the running loop with its await chain (between :data:`BEGIN` and
    :data:`END`); returns the number of tasks."""
    stream = sys.stderr if file is None else file
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    lines = [BEGIN]
    for task in tasks:
        lines.append(f"task {task.get_name()!r}{' (done)' if task.done() else ''}:")
        # the future the task is blocked on (CPython's Task keeps it there)
        lines.extend(await_chain(task.get_coro(), getattr(task, "_fut_waiter", None)))
    lines.append(END)
    stream.write("\n".join(lines) + "\n")
    stream.flush()
    return len(tasks)
