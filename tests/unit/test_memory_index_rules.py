"""Pure rules of the memory index: event -> operation, version rule, runs, names, point ids."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.errors import InvalidRequest
from memstream.projections.memory_index.layout import (
    PointIdentity,
    collection_name,
    identity_of,
    payload_of,
    point_id,
)
from memstream.projections.memory_index.rules import (
    Delete,
    Upsert,
    op_for_event,
    runs,
    should_apply,
)
from memstream.projections.memory_index.tuning import LEGACY, TUNING
from memstream.schemas.events import DecodeError, Envelope, MemoryEventType, memory_event
from memstream.schemas.records import MemoryEntry
from memstream.streams.memory_projector import ops_of_batch

T = datetime(2026, 1, 1, tzinfo=UTC)


def entry(
    key: str = "k", *, user: str | None = None, version: int = 1, **kw: object
) -> MemoryEntry:
    base = MemoryEntry(
        account_id="acct",
        agent_id="agent",
        key=key,
        content="User likes tea.",
        category="user_profile",
        visibility="private" if user else "shared",
        importance=0.8,
        content_hash="h",
        created_at=T,
        updated_at=T,
        user_id=user,
        version=version,
    )
    return base.with_changes(**kw) if kw else base


@pytest.mark.parametrize("typ", ["memory.stored", "memory.replaced", "memory.decayed"])
def test_changes_map_to_upsert(typ: MemoryEventType) -> None:
    e = entry(version=4)
    op = op_for_event(memory_event(typ, e, ts=1))
    assert op == Upsert(e)
    assert op.version == 4


@pytest.mark.parametrize("typ", ["memory.forgotten", "memory.expired"])
def test_removals_map_to_delete(typ: MemoryEventType) -> None:
    e = entry(user="u1", version=7)
    op = op_for_event(memory_event(typ, e, ts=1))
    assert op == Delete(PointIdentity("acct", "agent", "u1", "k"), 7)
    assert op.point_id == point_id(identity_of(e))


def test_recalled_and_other_events_change_nothing() -> None:
    assert op_for_event(memory_event("memory.recalled", entry(), ts=1)) is None
    other = Envelope(type="thread.created", id="x", ts=1, account_id="a", agent_id="g")
    assert op_for_event(other) is None


def test_unreadable_memory_event_raises_naming_the_field() -> None:
    bad = Envelope(type="memory.stored", id="x", ts=1, account_id="a", agent_id="g", data={})
    with pytest.raises(DecodeError) as e:
        ops_of_batch([bad])
    assert e.value.field == "data.entry"
    bad2 = memory_event("memory.stored", entry(), ts=1)
    raw_entry = bad2.data["entry"]
    assert isinstance(raw_entry, dict)
    raw_entry["category"] = "gossip"
    with pytest.raises(InvalidRequest) as e2:
        op_for_event(bad2)
    assert e2.value.field == "category"


def test_version_rule() -> None:
    up, de = Upsert(entry(version=5)), Delete(PointIdentity("a", "g", "", "k"), 5)
    assert should_apply(up, None)
    assert not should_apply(de, None)  # nothing to delete
    assert should_apply(up, 4)
    assert not should_apply(up, 5)  # same version: a redelivery, already applied
    assert not should_apply(up, 6)  # stale
    assert should_apply(de, 5) and should_apply(de, 1)
    assert not should_apply(de, 6)  # a newer entry survives an old delete


def test_runs_keep_order_across_deletes_and_dedupe_upserts() -> None:
    a1, a2, b1 = Upsert(entry("a", version=1)), Upsert(entry("a", version=2)), Upsert(entry("b"))
    d = Delete(identity_of(entry("a")), 3)
    a4 = Upsert(entry("a", version=4))
    assert runs([a1, b1, a2, d, a4]) == [[a2, b1], [d], [a4]]
    assert runs([a2, a1]) == [[a2]]  # the stale one is dropped, not the newer
    assert runs([]) == []


def test_private_and_shared_entries_are_different_points() -> None:
    shared = entry()
    mine, yours = entry(user="u1"), entry(user="u2")
    ids = {point_id(identity_of(e)) for e in (shared, mine, yours)}
    assert len(ids) == 3
    assert identity_of(shared).owner == ""
    assert point_id(identity_of(mine)) == point_id(PointIdentity("acct", "agent", "u1", "k"))


@given(
    st.tuples(st.text(), st.text(), st.text(), st.text()),
    st.tuples(st.text(), st.text(), st.text(), st.text()),
)
def test_point_ids_are_deterministic_uuids_and_unambiguous(
    a: tuple[str, ...], b: tuple[str, ...]
) -> None:
    pa, pb = PointIdentity(*a), PointIdentity(*b)
    assert point_id(pa) == point_id(PointIdentity(*a))
    assert uuid.UUID(point_id(pa)).version == 5
    if pa != pb:
        assert point_id(pa) != point_id(pb)


def test_point_id_does_not_confuse_separators() -> None:
    assert point_id(PointIdentity("a", "b/c", "", "k")) != point_id(
        PointIdentity("a/b", "c", "", "k")
    )


def test_collection_name_per_account_and_environment() -> None:
    n = collection_name("Acme Corp", "prod")
    assert n == collection_name("Acme Corp", "prod")
    assert re.fullmatch(r"[a-z0-9-]+", n)
    assert "prod" in n and "acme-corp" in n
    # distinct pairs never collide, even when their slugs do
    assert collection_name("Acme Corp", "prod") != collection_name("acme-corp", "prod")
    assert collection_name("Acme Corp", "prod") != collection_name("Acme Corp", "staging")
    assert len(collection_name("x" * 500, "e" * 100)) < 100


def test_payload_carries_filters_and_version_not_content() -> None:
    exp = datetime(2026, 2, 1, tzinfo=UTC)
    p = payload_of(entry(user="u1", version=9, expires_at=exp))
    assert p == {
        "account_id": "acct",
        "agent_id": "agent",
        "owner": "u1",
        "visibility": "private",
        "user_id": "u1",
        "key": "k",
        "category": "user_profile",
        "importance": 0.8,
        "expires_at": exp.timestamp(),
        "version": 9,
    }
    assert payload_of(entry())["expires_at"] is None


def test_exact_scan_covers_agents_by_the_bytes_of_their_vectors() -> None:
    # TUNING scores an agent of up to 20k 384-d entries exactly, a larger one walks its graph
    assert TUNING.scans_exactly(20_000, 384)
    assert not TUNING.scans_exactly(20_001, 384)
    # the budget is bytes: 1,536-d vectors (OpenAI) take 4x as much per entry
    assert TUNING.scans_exactly(5_000, 1_536) and not TUNING.scans_exactly(5_001, 1_536)
    assert not LEGACY.scans_exactly(1, 384)  # no threshold: never


def test_a_negative_exact_scan_budget_is_refused() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="exact_scan_kb"):
        replace(TUNING, exact_scan_kb=-1)
