"""The body limit's pure rules: a declared ``Content-Length`` read as a length."""

from __future__ import annotations

from memstream.agents_ctx.http.body_limit import declared_length


def test_a_declared_length_is_its_number_and_anything_else_is_none() -> None:
    assert declared_length(b"0") == 0
    assert declared_length(b"1048576") == 1_048_576
    assert declared_length(b"999999999999999999") == 999_999_999_999_999_999
    for bad in (b"", b"-1", b"1e3", b" 12", b"12 ", b"0x10", "\u00b2".encode()):
        assert declared_length(bad) is None, bad


def test_a_length_of_thousands_of_digits_is_over_any_limit_not_an_error() -> None:
    # int() refuses more than 4,300 digits (ValueError): that used to be a 500
    assert declared_length(b"9" * 5000) >= 1 << 63  # type: ignore[operator]
    assert declared_length(b"1" + b"0" * 19) >= 1 << 63  # type: ignore[operator]
