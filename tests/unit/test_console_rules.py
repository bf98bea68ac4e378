"""The console's pure rules: sessions expire and close, CSRF tokens compare exactly, an
unset admin credential never matches, and the lag history yields chart series and
events/s from end offsets."""

from __future__ import annotations

from memstream.agents_ctx.console.history import LagHistory
from memstream.agents_ctx.console.ports import LagPoint
from memstream.agents_ctx.console.sessions import Sessions, credential_ok, csrf_ok


def test_sessions_expire_and_close() -> None:
    store = Sessions(ttl_s=10)
    s = store.open(now=100)
    assert store.get(s.sid, now=105) == s
    assert store.get(s.sid, now=111) is None  # expired, and forgotten
    t = store.open(now=200)
    store.close(t.sid)
    assert store.get(t.sid, now=201) is None
    assert store.get(None) is None and store.get("") is None
    assert store.get("made-up", now=201) is None


def test_csrf_and_credential_checks() -> None:
    s = Sessions().open()
    assert csrf_ok(s, s.csrf)
    assert not csrf_ok(s, None) and not csrf_ok(s, "") and not csrf_ok(s, s.csrf + "x")
    assert not csrf_ok(Sessions().open(), s.csrf)  # another session's token
    assert credential_ok("secret", "secret")
    assert not credential_ok("secret", "Secret") and not credential_ok("", "")


def _rows(end: int, committed: int) -> list[LagPoint]:
    return [
        LagPoint("counters", "memstream.journal", p, committed, end, end - committed)
        for p in (0, 1)
    ] + [LagPoint("message-projector", "memstream.journal", 0, committed, end, end - committed)]


def test_history_series_rates_and_window() -> None:
    h = LagHistory(window_s=60)
    assert h.events_per_s() == {} and h.latest() is None
    h.add(1000.0, _rows(100, 100))
    h.add(1002.0, _rows(300, 150))  # each partition grew by 200 in 2 s
    series = h.series()
    assert series["ts"] == [1000.0, 1002.0]
    assert series["series"] == {
        "counters p0": [0, 150],
        "counters p1": [0, 150],
        "message-projector p0": [0, 150],
    }
    # partitions counted once per topic even when several groups read them
    assert h.events_per_s() == {"memstream.journal": 200.0}
    h.add(1100.0, _rows(300, 300))  # the older samples fall out of the window
    assert h.series()["ts"] == [1100.0]
