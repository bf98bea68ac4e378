"""Every statement of ``src`` that keeps Postgres session state marks its connection, so
the pool resets it on release (``infra/postgres``: the reset is skipped for the rest;
behaviour tested in ``tests/integration/test_pg_session_state.py``)."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "memstream"

# statements that keep state past their transaction (a transaction-local ``set_config(...,
# true)`` or ``pg_advisory_xact_lock`` does not); a statement opening a string, so an
# ``UPDATE``'s ``SET`` line is not one
_SESSION_STATE = re.compile(
    r"pg_(try_)?advisory_lock(_shared)?\(|add_listener\(|(?:\bf)?[\"'](SET|LISTEN|DECLARE|PREPARE)\s"
    r"|CREATE\s+TEMP|set_config\([^)]*,\s*false\)"
)


def test_every_statement_that_keeps_session_state_marks_its_connection() -> None:
    """A file of ``src`` that takes a session lock, listens or sets a session setting also
    calls ``keeps_session_state`` (else its connection would go back to the pool as is)."""
    unmarked = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name == "postgres.py" and path.parent.name == "infra":
            text = text.split("def _init_connection", 1)[1]  # the class's own docs above
        hits = [m.group(0) for m in _SESSION_STATE.finditer(text)]
        if hits and "keeps_session_state(" not in text:
            unmarked.append(f"{path.relative_to(SRC)}: {hits}")
    assert not unmarked, unmarked
    # and the scan does find them: the four places known today
    found = {
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if _SESSION_STATE.search(p.read_text(encoding="utf-8"))
    }
    assert {
        "infra/postgres.py",
        "infra/cli/pipeline.py",
        "streams/outbox_relay.py",
    } <= found
