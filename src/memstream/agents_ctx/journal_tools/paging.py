"""Byte-range paging over a UTF-8 document that never splits a character. Pure.

Rules (``journal_tool_call_view``):

- Pages cover the document's UTF-8 bytes ``[offset, end)``; ``end`` is at most
  ``offset + length`` and is moved back to the nearest character boundary, so every page is
  valid UTF-8 on its own and the pages, concatenated in ``next_offset`` order, are the
  document byte for byte.
- ``length`` defaults to, and is capped at, :data:`TOOL_VIEW_MAX_BYTES` (32,768): a larger
  value is lowered to the cap, a value below 1 is an ``invalid_request`` naming ``length``.
- ``offset`` must be a character boundary in ``[0, total_bytes]``. Offsets handed out as
  ``next_offset`` always are; an offset inside a multi-byte character is rejected (naming
  ``offset``) rather than silently moved, so a client never receives bytes it did not ask
  for. ``offset == total_bytes`` gives an empty last page.
- ``next_offset`` is None on the last page.
- A ``length`` too small to hold the character at ``offset`` (1-3 bytes before a wider
  character) is rejected naming ``length``: an empty non-final page would loop forever.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.errors import InvalidRequest
from memstream.schemas.limits import TOOL_VIEW_MAX_BYTES


@dataclass(frozen=True, slots=True)
class BytePage:
    """One page: ``data`` is the decoded text of bytes ``[offset, offset + len(data bytes))``."""

    offset: int
    data: str
    total_bytes: int
    next_offset: int | None


def _is_continuation(b: int) -> bool:
    return (b & 0xC0) == 0x80


def clamp_length(length: int) -> int:
    """The effective page length: at least 1 (else ``invalid_request`` naming ``length``),
    at most the 32,768-byte cap."""
    if length < 1:
        raise InvalidRequest("length must be at least 1", field="length")
    return min(length, TOOL_VIEW_MAX_BYTES)


def page_utf8(document: bytes, offset: int = 0, length: int = TOOL_VIEW_MAX_BYTES) -> BytePage:
    """The page of ``document`` (valid UTF-8) starting at byte ``offset``."""
    length = clamp_length(length)
    total = len(document)
    if offset < 0 or offset > total:
        raise InvalidRequest(f"offset must be between 0 and {total}", field="offset")
    if offset < total and _is_continuation(document[offset]):
        raise InvalidRequest(
            "offset falls inside a multi-byte character; use a next_offset value",
            field="offset",
        )
    end = min(offset + length, total)
    while end < total and end > offset and _is_continuation(document[end]):
        end -= 1
    if end == offset and offset < total:
        raise InvalidRequest("length is too small to hold the character at offset", field="length")
    return BytePage(
        offset=offset,
        data=document[offset:end].decode("utf-8"),
        total_bytes=total,
        next_offset=end if end < total else None,
    )
