"""Which errors mean "a dependency is down" (Postgres, Valkey, the broker, the network), and
which dependency.

A route that meets one of :data:`OUTAGE_ERRORS` answers 503 ``store_unavailable`` with
``Retry-After`` (``agents_ctx.http.errors``), never a plain-text 500: the request may succeed
once the store is back.

A stream processor asks :func:`dependency_of` about a handler's error: a dependency outage
pauses the processor (the same batch is retried with backoff, nothing is committed or
dead-lettered, its loop state reads ``waiting for postgres``) where a record that cannot be
applied (a decode or validation error) is dead-lettered (``streams.processor``).

Pure: classes and rules only, no I/O.
"""

from __future__ import annotations

import errno
import socket

import asyncpg
import redis.exceptions
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from memstream.errors import RetryableInfraError

__all__ = ["OUTAGE_ERRORS", "TRANSIENT_ERRORS", "dependency_of", "is_transient"]

#: Connection refused/reset/timed out (``TimeoutError`` is an ``OSError``: a pool acquire
#: that times out lands here too), a Postgres connection lost or refused, Valkey or the
#: broker unreachable.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,  # includes ConnectionDoesNotExistError
    asyncpg.CannotConnectNowError,  # starting up or shutting down
    # a connection whose server died mid-operation ("cannot switch to state 11; another
    # operation (2) is in progress", seen when Postgres is killed under a request)
    asyncpg.InternalClientError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    KafkaConnectionError,
    KafkaTimeoutError,
)

#: Errors that say a dependency is away, not that the record is bad: the network ones of
#: :data:`OUTAGE_ERRORS` (but not any ``OSError``: a file name too long is the record's
#: fault; see :data:`_TRANSIENT_ERRNOS`), and what a driver raises while its server goes
#: away or comes back (a closed pool or connection, an admin or crash shutdown, too many
#: connections, Valkey still loading its data).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    ConnectionError,  # refused, reset, aborted, broken pipe
    TimeoutError,
    socket.gaierror,  # the host name does not resolve (yet)
    asyncpg.PostgresConnectionError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    KafkaConnectionError,
    KafkaTimeoutError,
    RetryableInfraError,  # an adapter's own verdict: "retry may succeed"
    asyncpg.InterfaceError,  # "pool is closing", "connection is closed"
    asyncpg.InternalClientError,  # a connection left mid-operation by a server that died
    asyncpg.exceptions.OperatorInterventionError,  # admin/crash shutdown, cannot connect now
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    redis.exceptions.BusyLoadingError,
)

#: top-level module of a driver's exception -> the dependency it talks to
_DRIVERS = {
    "asyncpg": "postgres",
    "psycopg": "postgres",
    "redis": "valkey",
    "valkey": "valkey",
    "aiokafka": "kafka",
    "kafka": "kafka",
    "clickhouse_connect": "clickhouse",
    "chdb": "clickhouse",
    "qdrant_client": "qdrant",
    "qdrant_edge": "qdrant",
    "obstore": "object store",
    "openai": "model",
}

#: words in an adapter's message -> the dependency (first match wins)
_WORDS = (
    ("postgres", "postgres"),
    ("data keys", "postgres"),
    ("redis", "valkey"),
    ("valkey", "valkey"),
    ("clickhouse", "clickhouse"),
    ("chdb", "clickhouse"),
    ("qdrant", "qdrant"),
    ("kafka", "kafka"),
    ("publishing to", "kafka"),
    ("broker", "kafka"),
    ("object store", "object store"),
    ("journal", "journal"),
    ("embedding", "embedder"),
    ("model", "model"),
)


#: ``OSError`` numbers of a dependency away (the network, a full disk), not of a bad record
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENOSPC,
        errno.EDQUOT,
    }
)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, else ``__context__``)."""
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(out) < 16 and all(e is not seen for seen in out):
        out.append(e)
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    return out


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` says a dependency is away (retrying the same record may succeed),
    not that the record is bad. A broker error counts when aiokafka marks it retriable."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


def dependency_of(exc: BaseException) -> str | None:
    """The dependency ``exc`` says is away (``postgres``, ``valkey``, ``kafka``,
    ``clickhouse``, ``qdrant``, ``object store``, ``journal``, ``model``...), or None when
    ``exc`` is not a transient dependency failure (the record is to blame)."""
    if not is_transient(exc):
        return None
    chain = _chain(exc)
    for e in chain:
        name = _DRIVERS.get(type(e).__module__.split(".", 1)[0])
        if name is not None:
            return name
    for e in chain:
        text = str(e).lower()
        for word, name in _WORDS:
            if word in text:
                return name
    return "a dependency"
