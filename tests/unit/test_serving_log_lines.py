"""The log lines of the serving commands: the access line as it always was, none lost at exit,
and a stalled log reader never stalls the requests.

Each case runs a child process that configures logging as ``memstream up`` does
(``setup_logging``) and sends requests through the ``Observe`` middleware to a tiny ASGI
app, which itself logs one warning; the test reads the child's stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PATH = "/v1/agents/a/threads/t/messages"

CHILD = """
import asyncio, logging, os, sys, types
from memstream.agents_ctx.http.observe import Observe
from memstream.infra.cli.main import setup_logging

log_format, n, end = sys.argv[1], int(sys.argv[2]), sys.argv[3]
setup_logging(False, log_format, True)
import logging.config, uvicorn.config  # as the HTTP server does when it starts
logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)

async def app(scope, receive, send):
    logging.getLogger("memstream.probe").warning("inside %s", "the request")
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b""})

async def main():
    observe = Observe(app, types.SimpleNamespace(metrics=None))
    async def receive():
        return {"type": "http.request", "body": b""}
    async def send(message):
        pass
    for i in range(n):
        scope = {"type": "http", "method": "POST", "path": "PATH", "client": ("127.0.0.1", 5555),
                 "headers": [(b"x-request-id", f"rid-{i}".encode())]}
        await observe(scope, receive, send)

asyncio.run(main())
print("served", flush=True)
if end == "watchdog":  # memstream up's exit watchdog ends the process (os._exit)
    import time
    from memstream.infra.cli.main import _exit_if_stuck
    _exit_if_stuck(0.0)
    time.sleep(60)
""".replace("PATH", PATH)

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
TEXT_ACCESS = re.compile(
    rf"{STAMP} INFO memstream\.access: POST {re.escape(PATH)} 201 \d+\.\dms "
    rf"request_id=rid-0 method=POST path={re.escape(PATH)} route=unmatched status=201 "
    r"duration_ms=\d+(\.\d+)? client=127\.0\.0\.1:5555"
)
TEXT_INSIDE = re.compile(rf"{STAMP} WARNING memstream\.probe: inside the request request_id=rid-0")


def _child(log_format: str, n: int, end: str = "exit") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, log_format, str(n), end],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_text_access_line_and_a_line_logged_inside_the_request() -> None:
    out, err = _child("text", 1).communicate(timeout=60)
    assert out == "served\n"
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert TEXT_INSIDE.fullmatch(lines[0]), lines[0]
    assert TEXT_ACCESS.fullmatch(lines[1]), lines[1]


def test_the_json_access_line_and_a_line_logged_inside_the_request() -> None:
    out, err = _child("json", 1).communicate(timeout=60)
    assert out == "served\n"
    inside, access = (json.loads(line) for line in err.splitlines())
    assert list(inside) == ["ts", "level", "logger", "message", "request_id"]
    assert inside["message"] == "inside the request"
    assert inside["request_id"] == "rid-0"
    assert list(access) == [
        "ts",
        "level",
        "logger",
        "message",
        "request_id",
        "method",
        "path",
        "route",
        "status",
        "duration_ms",
        "client",
    ]
    assert re.fullmatch(rf"POST {re.escape(PATH)} 201 \d+\.\dms", access["message"])
    assert access["logger"] == "memstream.access"
    assert (access["request_id"], access["status"], access["client"]) == (
        "rid-0",
        201,
        "127.0.0.1:5555",
    )


def test_no_line_is_lost_when_the_process_ends_right_after_logging() -> None:
    n = 3000
    for end in ("exit", "watchdog"):
        out, err = _child("text", n, end).communicate(timeout=120)
        assert out == "served\n"
        access = [line for line in err.splitlines() if " memstream.access: " in line]
        ids = [re.search(r"request_id=rid-(\d+)", line) for line in access]
        assert [int(m.group(1)) for m in ids if m] == list(range(n)), end


def test_a_log_reader_that_stopped_reading_does_not_stop_the_requests() -> None:
    # ~300 bytes a request: 2000 fill a pipe nobody reads (64 KiB) many times over
    n = 2000
    child = _child("text", n)
    try:
        stdout = child.stdout
        assert stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)  # stderr is not read meanwhile
        assert got == ["served\n"], "requests stalled behind a full log pipe"
        _, err = child.communicate(timeout=60)  # now read: every line is there
        assert sum(" memstream.access: " in line for line in err.splitlines()) == n
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_line_shows_its_arguments_as_they_were_when_logged() -> None:
    import io
    import logging

    from memstream.infra.log_queue import OffLoopHandler

    opened = threading.Event()

    class Gated(logging.StreamHandler[io.StringIO]):
        def emit(self, record: logging.LogRecord) -> None:
            opened.wait(10)  # the thread writes only once the list below changed
            super().emit(record)

    out = io.StringIO()
    handler = OffLoopHandler([Gated(out)])
    logger = logging.Logger("memstream.probe")
    logger.addHandler(handler)
    handler.start()
    seen = [1]
    logger.warning("seen %s, %d", seen, 7)
    seen.append(2)
    opened.set()
    handler.close()  # as dictConfig does: written, and the thread goes on
    logger.warning("then %s", "more")
    handler.stop()
    logger.warning("after the stop %s", "too")
    assert out.getvalue() == "seen [1], 7\nthen more\nafter the stop too\n"
