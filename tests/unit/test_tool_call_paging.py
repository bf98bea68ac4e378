"""UTF-8-safe byte paging of tool-call documents (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.agents_ctx.journal_tools import page_utf8, tool_call_document
from memstream.errors import InvalidRequest
from memstream.infra.journal.codec import ToolCallRecord
from memstream.schemas.limits import TOOL_VIEW_MAX_BYTES


def all_pages(doc: bytes, length: int) -> list[bytes]:
    out: list[bytes] = []
    offset: int | None = 0
    while offset is not None:
        page = page_utf8(doc, offset, length)
        assert page.offset == offset
        assert page.total_bytes == len(doc)
        out.append(page.data.encode("utf-8"))
        offset = page.next_offset
        assert len(out) <= len(doc) + 1
    return out


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400), length=st.integers(min_value=4, max_value=64))
def test_pages_reassemble_byte_exact_and_never_split(text: str, length: int) -> None:
    doc = text.encode("utf-8")
    pages = all_pages(doc, length)
    assert b"".join(pages) == doc
    for p in pages:
        assert len(p) <= length
        p.decode("utf-8")  # each page alone is valid UTF-8
    assert all(pages[:-1]), "only the last page may be empty"


@settings(max_examples=30, deadline=None)
@given(unit=st.sampled_from(["a", "é", "€", "😀"]), n=st.integers(30_000, 70_000))
def test_default_pages_are_at_most_32k(unit: str, n: int) -> None:
    doc = (unit * n).encode("utf-8")
    pages = all_pages(doc, TOOL_VIEW_MAX_BYTES)
    assert b"".join(pages) == doc
    assert all(len(p) <= TOOL_VIEW_MAX_BYTES for p in pages)
    # each page but the last is full up to at most 3 bytes (one partial character held back)
    assert all(len(p) > TOOL_VIEW_MAX_BYTES - 4 for p in pages[:-1])


def test_page_end_moves_back_before_a_multibyte_char() -> None:
    doc = ("a" * 32_767 + "€" + "b").encode()  # € (3 bytes) straddles byte 32768
    first = page_utf8(doc)
    assert len(first.data.encode()) == 32_767
    assert first.next_offset == 32_767
    second = page_utf8(doc, 32_767)
    assert second.data == "€b" and second.next_offset is None


def test_length_is_capped_not_rejected() -> None:
    doc = b"x" * 40_000
    page = page_utf8(doc, 0, 1_000_000)
    assert len(page.data) == TOOL_VIEW_MAX_BYTES and page.next_offset == TOOL_VIEW_MAX_BYTES


def test_last_page_has_no_next_offset_and_offset_at_end_is_empty() -> None:
    assert page_utf8(b"abc", 0, 10).next_offset is None
    end = page_utf8(b"abc", 3, 10)
    assert end.data == "" and end.next_offset is None


@pytest.mark.parametrize(
    ("offset", "length", "field"),
    [(-1, 10, "offset"), (99, 10, "offset"), (1, 10, "offset"), (0, 0, "length"), (0, 1, "length")],
)
def test_bad_ranges_name_the_field(offset: int, length: int, field: str) -> None:
    doc = "€uro".encode()  # offset 1 is inside €; length 1 cannot hold €
    with pytest.raises(InvalidRequest) as e:
        page_utf8(doc, offset, length)
    assert e.value.field == field


def test_document_is_deterministic_json() -> None:
    rec = ToolCallRecord(name="search", arguments={"q": "ü", "n": 1}, result="ok")
    assert (
        tool_call_document(rec)
        == b'{"name":"search","arguments":{"q":"\xc3\xbc","n":1},"result":"ok"}'
    )
    assert tool_call_document(rec) == tool_call_document(
        ToolCallRecord(name="search", arguments={"q": "ü", "n": 1}, result="ok")
    )
