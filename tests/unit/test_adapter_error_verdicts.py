"""Adapters tell "the store is away" (retryable: a processor pauses on it) from "the store
refuses this" (permanent: a processor dead-letters the record rather than stall for ever)."""

from __future__ import annotations

import asyncpg
import pytest
import redis.exceptions

from memstream.errors import PermanentInfraError, RetryableInfraError
from memstream.infra.data_keys import _keys_error
from memstream.infra.outage import dependency_of
from memstream.infra.thread_state import _call


@pytest.mark.parametrize(
    ("raised", "verdict"),
    [
        (redis.exceptions.ConnectionError("Connection refused"), RetryableInfraError),
        (redis.exceptions.TimeoutError("Timeout reading from socket"), RetryableInfraError),
        (redis.exceptions.BusyLoadingError("LOADING"), RetryableInfraError),
        (redis.exceptions.ResponseError("ERR Error running script"), PermanentInfraError),
        (redis.exceptions.DataError("Invalid input of type: 'dict'"), PermanentInfraError),
    ],
)
async def test_thread_state_redis_errors(raised: Exception, verdict: type[Exception]) -> None:
    async def fail() -> None:
        raise raised

    with pytest.raises(verdict) as info:
        await _call(fail, "counting")
    assert isinstance(info.value, PermanentInfraError) == (dependency_of(info.value) is None)


def test_data_keys_postgres_errors() -> None:
    away = _keys_error(asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"))
    assert isinstance(away, RetryableInfraError) and dependency_of(away) is not None
    refused = _keys_error(asyncpg.exceptions.UndefinedTableError('relation "data_keys"'))
    assert isinstance(refused, PermanentInfraError) and dependency_of(refused) is None


def test_a_connection_left_mid_operation_by_a_dead_postgres_is_an_outage() -> None:
    """What asyncpg raised on a route when Postgres was killed under it (seen in the outage
    chaos test): an outage (503 with Retry-After, a processor pauses), not a bad request."""
    from memstream.infra.outage import OUTAGE_ERRORS

    exc = asyncpg.InternalClientError(
        "cannot switch to state 11; another operation (2) is in progress"
    )
    assert dependency_of(exc) == "postgres"
    assert isinstance(exc, OUTAGE_ERRORS)
