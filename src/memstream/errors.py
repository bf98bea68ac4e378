"""The one error tree of memstream.

Every error we raise on purpose derives from :class:`MemstreamError`::

    MemstreamError
    ├── InvalidRequest            bad input; names the offending ``field``      (HTTP 400/422)
    │   ├── PromptInjection       memory content matched an injection pattern   (HTTP 422)
    │   ├── PrivateRequiresUser   credentials/PII with no user to make it private (HTTP 422)
    │   ├── ContentTooLong        content over the category's maximum          (HTTP 422)
    │   └── BodyTooLarge          a request body over the size limit, chunked or not (HTTP 413)
    ├── Unauthorized              missing or unknown API key                    (HTTP 401)
    ├── Forbidden                 the key may not do this (e.g. needs an admin key) (HTTP 403)
    │   └── MemoryNotBound        memory tools on an agent without Memory bound (HTTP 403)
    ├── NotFound                  no such agent/thread/summary/tool call         (HTTP 404)
    ├── CapacityExceeded          category capacity per agent or per user full  (HTTP 409)
    ├── Conflict                  an optimistic check lost (summary version...) (HTTP 409)
    ├── NotReady                  a projection has not yet applied a position   (HTTP 409)
    ├── JournalError              the journal (SlateDB)
    │   ├── JournalUnavailable    cannot be read or written right now           (HTTP 503)
    │   └── JournalFenced         a newer writer took over; this one is closed  (HTTP 503)
    └── InfraError                an adapter failed talking to a real system
        ├── RetryableInfraError   transient: retry may succeed
        │   ├── StoreUnavailable  a store (Postgres, Valkey, the broker) is down (HTTP 503)
        │   └── StoreBusy         a store did not grant a lock or a connection in time (HTTP 503)
        └── PermanentInfraError   will not succeed by retrying
            └── ServerStartError  an embedded server could not start

The HTTP surface maps each class to its ``code`` (``error_code``) and status; nothing else
needs to know about HTTP. Every 503 carries ``Retry-After: RETRY_AFTER_S``; a driver's own
connection error escaping a route (``infra.outage.OUTAGE_ERRORS``) is answered as
:class:`StoreUnavailable`.
"""

from __future__ import annotations

#: Seconds a client is told to wait (``Retry-After``) before retrying a 503.
RETRY_AFTER_S = 2


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""

    code: str = "internal"
    status: int = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, str]:
        out = {"code": self.code, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


class InvalidRequest(MemstreamError):
    code = "invalid_request"
    status = 400


class PromptInjection(InvalidRequest):
    code = "prompt_injection"
    status = 422


class PrivateRequiresUser(InvalidRequest):
    code = "private_requires_user"
    status = 422


class ContentTooLong(InvalidRequest):
    code = "content_too_long"
    status = 422


class BodyTooLarge(InvalidRequest):
    """A request body over the size limit (declared or counted while it streams in)."""

    status = 413


class Unauthorized(MemstreamError):
    code = "unauthorized"
    status = 401


class Forbidden(MemstreamError):
    code = "forbidden"
    status = 403


class MemoryNotBound(Forbidden):
    code = "memory_not_bound"


class NotFound(MemstreamError):
    code = "not_found"
    status = 404


class CapacityExceeded(MemstreamError):
    code = "capacity_exceeded"
    status = 409


class Conflict(MemstreamError):
    code = "conflict"
    status = 409


class NotReady(MemstreamError):
    code = "not_ready"
    status = 409

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class JournalError(MemstreamError):
    code = "journal_unavailable"
    status = 503


class JournalUnavailable(JournalError):
    pass


class JournalFenced(JournalError):
    pass


class InfraError(MemstreamError):
    code = "infra_error"
    status = 503


class RetryableInfraError(InfraError):
    pass


class StoreUnavailable(RetryableInfraError):
    code = "store_unavailable"


class StoreBusy(RetryableInfraError):
    """Postgres did not give a connection, a lock or a statement's answer within its bound
    (lock, statement or pool timeout): the request gave up instead of waiting for ever."""

    code = "store_busy"


class PermanentInfraError(InfraError):
    pass


class ServerStartError(PermanentInfraError):
    """An embedded server could not start: says which binary, which port, last log lines."""
