"""The serving commands' event loop (``main.event_loop_factory``) and child launches on it.

``memstream up`` / ``api`` / ``worker`` run on uvloop when it is installed. uvloop's
``subprocess_exec`` refuses ``Popen``'s ``user=``, which the embedded launchers used (Postgres
refuses to run as root); they now switch user in the child's set-up instead, so a child
server starts and stops the same way on either loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import typer

from memstream.infra.cli.main import event_loop_factory
from memstream.infra.embedded.base import EmbeddedServer

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_asyncio_when_asked() -> None:
    assert event_loop_factory("asyncio") is None


@pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop (the server extra) is not installed")
def test_auto_and_uvloop_pick_uvloop_when_installed() -> None:
    import uvloop

    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert event_loop_factory("auto") is None
    with pytest.raises(typer.Exit) as exit_:
        event_loop_factory("uvloop")
    assert exit_.value.exit_code == 2


class Listener(EmbeddedServer):
    """A tiny child server: listens on its port until stopped; run as ourselves by name
    (the path the Postgres launcher takes as root)."""

    name = "listener"

    def command(self) -> list[str]:
        code = (
            "import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
            "time.sleep(120)\n"
        )
        return [sys.executable, "-c", code, str(self.port)]

    def run_as(self) -> str | None:
        return pwd.getpwuid(os.getuid()).pw_name


def _loops() -> list[object]:
    out: list[object] = [pytest.param(None, id="asyncio")]
    if HAVE_UVLOOP:
        import uvloop

        out.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return out


@pytest.mark.parametrize("factory", _loops())
def test_a_child_server_runs_as_its_user_and_stops_on_either_loop(
    tmp_path: Path, factory: Callable[[], asyncio.AbstractEventLoop] | None
) -> None:
    async def scenario() -> tuple[int, int | None, bool]:
        server = Listener(tmp_path)
        await server.start()
        pid = server.pid
        assert pid is not None
        with open(f"/proc/{pid}/status") as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        await server.stop()
        return uid, pid, os.path.exists(f"/proc/{pid}")

    with asyncio.Runner(loop_factory=factory) as runner:
        uid, _pid, alive = runner.run(scenario())
    assert uid == os.getuid()
    assert not alive


def test_the_serving_commands_set_the_switch_interval() -> None:
    """``run`` applies the ``switch_interval_s`` setting before the loop starts (Python's
    5 ms default let a busy loop starve the lexical index's writer: docs/operations.md);
    the other commands leave Python's own."""
    from memstream.infra.cli.main import run
    from memstream.infra.settings import Settings

    before = sys.getswitchinterval()

    async def seen() -> float:
        return sys.getswitchinterval()

    try:
        assert run(seen(), "asyncio", 0.0003) == pytest.approx(0.0003)
        sys.setswitchinterval(before)
        assert run(seen(), "asyncio") == pytest.approx(before)
        assert Settings().switch_interval_s < 0.001
    finally:
        sys.setswitchinterval(before)
