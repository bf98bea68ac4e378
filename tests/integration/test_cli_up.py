"""``memstream up`` end to end as a user runs it: a subprocess on a fresh data directory,
the ready line, appends over HTTP, ``memstream produce`` with good and bad lines, a clean
SIGTERM stop with no orphan server processes, and a restart that keeps the data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from memstream.infra.journal import Journal, local_store
from memstream.schemas.records import ThreadRef

pytestmark = pytest.mark.asyncio(loop_scope="session")

KEY = "test-key-123"


def start_up(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """``memstream up`` as a subprocess; its output is drained by a thread for as long as it
    runs (an unread pipe fills and blocks the process's logging, then its stop) and kept in
    ``OUTPUT[proc.pid]`` for failure messages."""
    env = {**os.environ, "MEMSTREAM_API_KEYS": f"acme:{KEY}"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memstream.infra.cli.main",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen: list[str] = []
    OUTPUT[proc.pid] = seen
    ready: list[str] = []
    got = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("memstream ready at ") and not ready:
                ready.append(line.split(" at ", 1)[1].strip())
                got.set()
        got.set()

    threading.Thread(target=drain, daemon=True).start()
    if not got.wait(180) or not ready:
        proc.kill()
        raise AssertionError("memstream up never printed its ready line:\n" + "".join(seen[-40:]))
    return proc, ready[0]


#: everything each ``start_up`` process printed, by pid
OUTPUT: dict[int, list[str]] = {}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memstream", *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )


def stop_up(proc: subprocess.Popen[str]) -> list[int]:
    """SIGTERM; returns pids of descendants still alive afterwards (should be none)."""
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)  # a bound for a hang, not a speed target
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # memstream prints every thread's stack
        time.sleep(2)
        proc.kill()
        proc.wait(30)
        code = None
    tail = "".join(OUTPUT.get(proc.pid, [])[-200:])
    assert code == 0, f"memstream up did not stop cleanly on SIGTERM (exit {code}):\n{tail}"
    time.sleep(0.5)
    return [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


async def test_up_produce_stop_restart(traversable_tmp: Path, tmp_path: Path) -> None:
    data = traversable_tmp / "up-data"
    proc, url = start_up(data)
    try:
        h = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=h, timeout=30) as c:
            assert (await c.get("/healthz")).status_code == 200
            r = await c.post(
                "/v1/agents/bot/threads/t1/messages", json={"role": "user", "content": "first"}
            )
            assert r.status_code == 201, r.text

        lines = tmp_path / "in.jsonl"
        lines.write_text(
            '{"account_id": "acme", "agent_id": "bot", "thread_id": "t1", "role": "assistant", "content": "second"}\n'
            '{"account_id": "acme", "agent_id": "bot", "thread_id": "t1", "role": "bogus", "content": "x"}\n'
            "not json\n"
            '{"account_id": "acme", "agent_id": "bot", "thread_id": "t2", "role": "user", "content": "other thread"}\n'
            '{"account_id": "acmee", "agent_id": "bot", "thread_id": "t1", "role": "user", "content": "typo"}\n'
        )
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "memstream.infra.cli.main",
                "produce",
                str(lines),
                "--data-dir",
                str(data),
            ],
            capture_output=True,
            check=False,
            text=True,
            timeout=120,
        )
        assert res.returncode == 1, res.stderr  # three bad lines
        assert "line 2 (role)" in res.stderr and "line 3" in res.stderr
        assert "line 5 (account_id)" in res.stderr and "no account 'acmee'" in res.stderr
        assert "2 appended, 3 failed" in res.stderr

        res = cli("hygiene", "--now", "--data-dir", str(data))
        assert res.returncode == 0, res.stderr
        assert "0 expired, 0 decayed" in res.stdout

        res = cli("lag", "--json", "--data-dir", str(data))
        assert res.returncode == 0, res.stderr
        lag_rows = json.loads(res.stdout)
        groups = {row["group"] for row in lag_rows}
        # groups that committed show "since commit" (read from the commits' metadata)
        assert any(row["since_commit_s"] is not None for row in lag_rows), lag_rows
        # every record below a committed offset was applied: no gap (streams.coverage)
        assert all(row["gap"] == 0 for row in lag_rows), lag_rows
        assert groups == {
            "memstream-counters",
            "memstream-summarizer",
            "memstream-message-projector",
            "memstream-memory-projector",
            # what the relays have not published yet, read from up's /readyz and Postgres
            "relay:journal",
            "relay:memory",
        }
        relays = {row["group"]: row for row in lag_rows if row["kind"] == "relay"}
        assert all(row["kind"] == "consumer" for row in lag_rows if row not in relays.values())
        assert relays["relay:journal"]["state"] == "running", relays
        assert all(isinstance(row["lag"], int) for row in relays.values()), relays

        # kill -USR2: every asyncio task with what it awaits, and up goes on
        proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 15
        dump = ""
        while time.monotonic() < deadline and "--- end of asyncio tasks ---" not in dump:
            time.sleep(0.2)
            text = "".join(OUTPUT.get(proc.pid, []))
            dump = text[text.find("--- asyncio tasks (kill -USR2) ---") :]
        assert "--- end of asyncio tasks ---" in dump, dump[-2000:]
        assert "task 'outbox-relay'" in dump and 'File "' in dump, dump[:2000]
        assert proc.poll() is None
    finally:
        leftovers = stop_up(proc)
    assert leftovers == [], f"orphan processes after SIGTERM: {leftovers}"

    # The data is durable: read the journal directly now that the writer is gone.
    journal = await Journal.open(local_store(data / "journal"), "journal")
    try:
        t1 = await journal.last(ThreadRef("acme", "bot", "t1"), 10)
        t2 = await journal.last(ThreadRef("acme", "bot", "t2"), 10)
    finally:
        await journal.close()
    assert [m.content for m in t1] == ["first", "second"]
    assert [m.content for m in t2] == ["other thread"]

    # Restart on the same data directory: the data is still there and appends continue.
    proc, url = start_up(data)
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as c:
            r = await c.post(
                "/v1/agents/bot/threads/t1/messages", json={"role": "user", "content": "third"}
            )
            assert r.status_code == 201 and r.json()["appended"][0]["offset"] == 2
    finally:
        assert stop_up(proc) == []


async def test_a_second_up_or_api_on_a_data_dir_in_use_refuses_and_touches_nothing(
    traversable_tmp: Path,
) -> None:
    """Defect 7 of issue 12: the second process used to open the journal (fencing the live
    writer) before failing on a ClickHouse lock."""
    data = traversable_tmp / "up-twice"
    proc, url = start_up(data)
    try:
        state = (data / "memstream.json").read_bytes()
        for command in ("up", "api"):
            started = time.monotonic()
            res = subprocess.run(
                [sys.executable, "-m", "memstream", command, "--data-dir", str(data)],
                capture_output=True,
                check=False,
                text=True,
                timeout=60,
                env={**os.environ, "MEMSTREAM_API_KEYS": f"acme:{KEY}"},
            )
            out = res.stdout + res.stderr
            assert res.returncode == 1, out
            assert "already running" in out and f"pid {proc.pid}" in out and url in out, out
            assert time.monotonic() - started < 30, "the refusal must come before any start-up"
            assert (data / "memstream.json").read_bytes() == state
        h = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=h, timeout=30) as c:
            r = await c.post(
                "/v1/agents/bot/threads/t9/messages", json={"role": "user", "content": "still here"}
            )
            assert r.status_code == 201, r.text  # the live writer is not fenced
    finally:
        assert stop_up(proc) == []
