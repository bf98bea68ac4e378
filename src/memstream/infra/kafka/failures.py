"""Translation of aiokafka failures into memstream's error tree.

Every adapter in :mod:`memstream.infra.kafka` raises only
:class:`~memstream.errors.RetryableInfraError` (the broker is unreachable, a leader is moving,
a request timed out: trying again later may succeed) or
:class:`~memstream.errors.PermanentInfraError` (a record too large, an unsupported request,
an authorization failure: retrying the same thing will not help).
"""

from __future__ import annotations

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from memstream.errors import InfraError, PermanentInfraError, RetryableInfraError

__all__ = ["KAFKA_FAILURES", "translate"]

#: what to catch around aiokafka calls
KAFKA_FAILURES: tuple[type[BaseException], ...] = (KafkaError, OSError, TimeoutError)


def is_retryable(exc: BaseException) -> bool:
    """True for failures that a later retry may overcome."""
    if isinstance(exc, KafkaConnectionError | KafkaTimeoutError | OSError | TimeoutError):
        return True
    return bool(getattr(exc, "retriable", False))


def translate(exc: BaseException, doing: str) -> InfraError:
    """The InfraError for ``exc``, raised while ``doing`` something (e.g. "publishing")."""
    if isinstance(exc, InfraError):
        return exc
    name = type(exc).__name__
    msg = f"kafka: {doing} failed: {name}: {exc}".rstrip(": ")
    if is_retryable(exc):
        return RetryableInfraError(msg)
    return PermanentInfraError(msg)
