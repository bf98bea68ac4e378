"""The pure rules of owning memory: views, the browse cursor, patch shapes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.agents_ctx.memory import editing
from memstream.errors import Forbidden, InvalidRequest
from memstream.schemas.records import Caller

NOW = datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_cursor_round_trips_to_the_microsecond() -> None:
    c = editing.Cursor(NOW, "alice", "key with / and ü")
    assert editing.Cursor.decode(c.encode()) == c
    assert editing.Cursor.decode(None) is None
    nul = editing.Cursor(NOW, "a\x00", "k").encode()  # Postgres refuses NUL in text
    for bad in ("x", "bm90IGpzb24", editing.Cursor(NOW, "a", "k").encode()[:-3] + "!!", nul):
        with pytest.raises(InvalidRequest) as e:
            editing.Cursor.decode(bad)
        assert e.value.field == "cursor"


def test_views() -> None:
    alice = Caller("acme", "bot", "alice")
    assert editing.view_of(alice, None) == editing.View(visible_to="alice")
    assert editing.view_of(alice, "alice") == editing.View(visible_to="alice")
    with pytest.raises(Forbidden):
        editing.view_of(alice, "bob")
    admin = Caller("acme", "bot", None, admin=True)
    assert editing.view_of(admin, None).every_user
    assert editing.view_of(admin, "bob").acting_user == "bob"


def test_patch_shapes() -> None:
    p = editing.parse_patch({"expires_at": None}, NOW)
    assert p.sets_expiry and p.expires_at is None
    with pytest.raises(InvalidRequest) as e:
        editing.parse_patch({"visibility": "shared"}, NOW)
    assert e.value.field == "visibility"
    with pytest.raises(InvalidRequest) as e:
        editing.parse_patch({"importance": None}, NOW)
    assert e.value.field == "importance"
    assert editing.resolve_limit(None) == 50
    assert editing.resolve_limit("200") == 200


def test_every_refusal_names_a_field() -> None:
    """Found by the contract fuzz: a PATCH body key "" was refused naming field "" (none);
    a NUL under an empty key likewise. Such errors name the body instead."""
    from memstream.agents_ctx.validation import check_json

    with pytest.raises(InvalidRequest) as e:
        editing.parse_patch({"": 1}, NOW)
    assert e.value.field == "body" and "'' cannot be edited" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        check_json({"": "a\x00b"}, "")
    assert e.value.field == "body"
    with pytest.raises(InvalidRequest) as e:
        editing.parse_import_line({"key": "k", "content": "c", "category": "observation",
                                   "created_at": "0001-01-01T00:00:00+14:00"},
                                  Caller("acme", "a", "alice"), NOW)  # fmt: skip
    assert e.value.field == "created_at"
    with pytest.raises(InvalidRequest) as e:
        editing.parse_import_line(
            {"key": "k", "content": "c", "category": "observation", "recall_count": 2**63},
            Caller("acme", "a", "alice"),
            NOW,
        )
    assert e.value.field == "recall_count"


def test_import_line_names_its_own_visibility_field() -> None:
    """Found by a new-user test: a bad ``visibility`` was refused naming ``scope``, a field
    an import line does not have."""
    line = {"key": "k", "content": "fine", "category": "observation", "visibility": "bogus"}
    with pytest.raises(InvalidRequest) as e:
        editing.parse_import_line(line, Caller("acme", "bot", None), NOW)
    assert e.value.field == "visibility"
