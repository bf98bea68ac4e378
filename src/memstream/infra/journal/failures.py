"""Translation of SlateDB failures into memstream's journal errors.

- ``Error.Closed(reason=FENCED)`` -> :class:`~memstream.errors.JournalFenced` (a newer writer
  opened the same database; this handle will never write again).
- any other SlateDB error (closed, unavailable, data, internal, invalid) or an ``OSError``
  -> :class:`~memstream.errors.JournalUnavailable`.
"""

from __future__ import annotations

from slatedb.uniffi import CloseReason
from slatedb.uniffi import Error as SlateError

from memstream.errors import JournalError, JournalFenced, JournalUnavailable

#: What a SlateDB call can raise that we translate (anything else is a bug and propagates).
SLATE_FAILURES: tuple[type[BaseException], ...] = (SlateError, OSError)


def is_fenced(exc: BaseException) -> bool:
    return isinstance(exc, SlateError.Closed) and exc.reason == CloseReason.FENCED


def translate(exc: BaseException, doing: str) -> JournalError:
    """The journal error for a SlateDB failure while ``doing`` something (for the message)."""
    if is_fenced(exc):
        return JournalFenced(
            f"journal writer fenced while {doing}: a newer writer opened the journal; "
            "this writer accepts no more appends"
        )
    return JournalUnavailable(f"journal unavailable while {doing}: {exc}")
