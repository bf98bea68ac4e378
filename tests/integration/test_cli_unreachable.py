"""The CLI when what it talks to is not there: one line naming what could not be reached
and exit 1, never a traceback (``lag`` and ``dlq list`` against a stopped broker, the
API-client commands against a stopped API, ``memory import`` of a file that is not there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

DOWN_API = "http://127.0.0.1:1"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memstream", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"COLUMNS": "200"} | (env or {}),
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("lag",), {"MEMSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"}, "kafka: reading high-water marks failed"),
        (("dlq", "list"), {"MEMSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"}, "kafka: reading high-water marks failed"),
        (("memory", "list", "bot", "--key", "k", "--url", DOWN_API), None, f"cannot reach the memstream API at {DOWN_API}"),
        (("erase", "thread", "bot", "t", "--key", "k", "--url", DOWN_API), None, f"cannot reach the memstream API at {DOWN_API}"),
        (("memory", "import", "bot", "no-such-file.ndjson", "--key", "k", "--url", DOWN_API), None, "cannot read no-such-file.ndjson"),
    ],
    ids=["lag", "dlq-list", "memory-list", "erase-thread", "import-missing-file"],
)  # fmt: skip
def test_an_unreachable_server_is_one_line_and_exit_1(
    args: tuple[str, ...], env: dict[str, str] | None, says: str
) -> None:
    res = cli(*args, env=env)
    assert res.returncode == 1, res.stderr[-2000:]
    assert says in " ".join(res.stderr.split()), res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "Unclosed" not in res.stderr, res.stderr[-2000:]
