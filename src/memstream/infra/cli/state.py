"""The state file ``<data_dir>/memstream.json`` that ``memstream up`` writes: where each
part it launched listens, and the admin token, so other commands (``produce``, ``lag``,
``replay``, ``keys``) can find a running system with just ``--data-dir``. Written 0600."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

STATE_FILE = "memstream.json"


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def write_state(data_dir: Path, state: dict[str, object]) -> None:
    path = state_path(data_dir)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def read_state(data_dir: Path) -> dict[str, object] | None:
    try:
        data = orjson.loads(state_path(data_dir).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def clear_running(data_dir: Path) -> None:
    state = read_state(data_dir)
    if state is not None:
        state["running"] = False
        state.pop("pid", None)
        write_state(data_dir, state)
