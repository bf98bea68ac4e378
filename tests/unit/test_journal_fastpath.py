"""The fast byte copy for SlateDB's binding gives back exactly the bytes it was given."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from slatedb.uniffi._slatedb_uniffi import slatedb as gen

from memstream.infra.journal import fastpath


def test_install_is_active_and_idempotent() -> None:
    assert fastpath.install() is True
    assert fastpath.install() is True
    assert gen._UniffiRustBufferBuilder.write is fastpath._fast_write


@given(st.binary(max_size=70_000))
def test_bytes_round_trip_through_the_binding(data: bytes) -> None:
    fastpath.install()
    conv = gen._UniffiFfiConverterBytes
    assert conv.lift(conv.lower(data)) == data
    assert conv.lift(conv.lower(bytearray(data))) == data


@given(st.text(max_size=2_000))
def test_strings_round_trip_through_the_binding(text: str) -> None:
    fastpath.install()
    conv = gen._UniffiFfiConverterString
    assert conv.lift(conv.lower(text)) == text
