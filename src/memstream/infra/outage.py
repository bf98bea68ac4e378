"""Which driver errors mean "a store is down" (Postgres, Valkey, the broker, the network).

A route that meets one of these answers 503 ``store_unavailable`` with ``Retry-After``
(``agents_ctx.http.errors``), never a plain-text 500: the request may succeed once the
store is back. Pure data: the classes only, no I/O.
"""

from __future__ import annotations

import asyncpg
import redis.exceptions
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

__all__ = ["OUTAGE_ERRORS"]

#: Connection refused/reset/timed out (``TimeoutError`` is an ``OSError``: a pool acquire
#: that times out lands here too), a Postgres connection lost or refused, Valkey or the
#: broker unreachable.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,  # includes ConnectionDoesNotExistError
    asyncpg.CannotConnectNowError,  # starting up or shutting down
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    KafkaConnectionError,
    KafkaTimeoutError,
)
