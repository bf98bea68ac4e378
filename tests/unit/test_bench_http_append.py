"""``bench/http_append.py`` leaves no server running, however it is stopped.

The bench runs with a stand-in ``memstream`` package first on the server's ``PYTHONPATH``: its
``memstream up`` starts a grandchild (as the real one starts Postgres, Valkey and a broker),
writes both pids, then either never gets ready (the bench is waiting in ``start``) or says it
is ready on a port that accepts and never answers (the bench is blocked mid-run). The test
signals the bench and checks that the bench exits and both processes are gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "http_append.py"

FAKE_UP = """
import os, socket, subprocess, sys, time
from pathlib import Path
out = Path(os.environ["FAKE_PIDS"])
child = subprocess.Popen(["sleep", "600"])
if os.environ["FAKE_READY"] == "1":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)  # accepts (the kernel does), never answers
    print(f"memstream ready at http://127.0.0.1:{s.getsockname()[1]}", flush=True)
out.with_suffix(".tmp").write_text(f"{os.getpid()} {child.pid}")
out.with_suffix(".tmp").rename(out)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent has not reaped it yet


@pytest.mark.parametrize("ready", [False, True], ids=["while-starting", "while-running"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_bench_leaves_no_server_behind(
    tmp_path: Path, ready: bool, sig: signal.Signals
) -> None:
    fake = tmp_path / "fake-src" / "memstream"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_UP)
    pids_file = tmp_path / "pids"
    env = {
        **os.environ,
        "FAKE_PIDS": str(pids_file),
        "FAKE_READY": "1" if ready else "0",
        "TMPDIR": str(tmp_path),  # the bench's work folder
    }
    bench = subprocess.Popen(
        [sys.executable, str(BENCH), "--server", f"fake={fake.parent}", "--clients", "2"]
        + ["--per-client", "1", "--rounds", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    server = grandchild = 0
    try:
        deadline = time.monotonic() + 60
        while not pids_file.exists():
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "the stand-in server never started"
            time.sleep(0.05)
        server, grandchild = map(int, pids_file.read_text().split())
        time.sleep(1.0 if ready else 0.2)  # ready: let the bench reach a blocking call
        bench.send_signal(sig)
        bench.wait(30)
        deadline = time.monotonic() + 10
        while (_alive(server) or _alive(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server), "memstream up outlived the bench"
        assert not _alive(grandchild), "a child of memstream up outlived the bench"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in (server, grandchild):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
