"""Valkey's append-only file after an erasure: the deleted keys' writes leave it.

``memstream up`` runs Valkey with ``appendonly yes``: every write (a thread's cached summary,
its counters) is appended to the AOF, and a ``DEL`` is appended after it, so the summary's
text stays in the file until the AOF is rewritten from the dataset (measured: it did). An
erasure therefore asks for a rewrite (``BGREWRITEAOF``, in Valkey's forked child: the server
keeps serving) once its keys are deleted, and waits until a rewrite that began after the
deletes has finished; the old files go with it. A rewrite already running may have forked
before the deletes, so it is waited for and another asked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from redis.exceptions import RedisError, ResponseError

log = logging.getLogger(__name__)

REWRITE_WAIT_S: Final = 60.0
"""How long an erasure waits for the rewrite (then warns and goes on)."""
_POLL_S: Final = 0.05


def _busy(info: dict[str, Any]) -> bool:
    return bool(
        int(info.get("aof_rewrite_in_progress", 0)) or int(info.get("aof_rewrite_scheduled", 0))
    )


async def rewrite_append_log(redis: Any, *, wait_s: float = REWRITE_WAIT_S) -> bool:
    """Rewrite the server's AOF from its dataset, begun after this call, and wait for it.
    Returns whether one finished; False (after a warning where it matters) when the server
    keeps no AOF, refuses the command (a managed service that hides it), or did not finish
    within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    try:
        info = await redis.info("persistence")
        if not int(info.get("aof_enabled", 0)):
            return False  # nothing on disk to rewrite
        while True:
            if not _busy(info):
                before = int(info.get("aof_rewrites", 0))
                try:
                    await redis.execute_command("BGREWRITEAOF")
                    break
                except ResponseError as e:  # one started meanwhile: wait for it, ask again
                    if "in progress" not in str(e):
                        raise
            if time.monotonic() > deadline:
                raise TimeoutError
            await asyncio.sleep(_POLL_S)
            info = await redis.info("persistence")
        while True:
            info = await redis.info("persistence")
            if not _busy(info) and int(info.get("aof_rewrites", 0)) > before:
                if info.get("aof_last_bgrewrite_status") != "ok":
                    log.warning("Valkey's AOF rewrite failed: erased keys stay in its file")
                    return False
                return True
            if time.monotonic() > deadline:
                raise TimeoutError
            await asyncio.sleep(_POLL_S)
    except TimeoutError:
        log.warning(
            "Valkey's AOF rewrite did not finish within %.0f s: erased keys may stay in its "
            "file until one does",
            wait_s,
        )
    except RedisError as e:
        log.warning("Valkey's AOF could not be rewritten (%s): erased keys stay in its file", e)
    return False
