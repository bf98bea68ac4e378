"""Append over HTTP on ``memstream up``, vs in-process ``Journal.append`` and ``/healthz``.

Run: ``python bench/http_append.py [--clients 64] [--per-client 40] [--rounds 4]
[--procs 1] [--server now=src] [--server main=/work/main/src] [--before REF] [--env K=V ...]``.

- **The server** is ``memstream up`` itself, a subprocess on a fresh data dir (embedded
  Postgres, Valkey and a Kafka broker; the journal writer, relays and every processor on its
  loop, as a user runs it). Each ``--server NAME=SRC`` starts one, with ``SRC`` first on its
  ``PYTHONPATH`` (so the code before and after a change run side by side, interleaved);
  ``--env`` passes ``MEMSTREAM_*`` settings to all of them. ``--before REF`` adds a server
  named ``before`` running ``git archive REF``'s ``src`` (a commit, branch or tag of this
  repository) beside this tree's.
- **No server outlives the bench.** Each ``memstream up`` runs in a process group of its own
  (its embedded servers die with it) and asks to get SIGTERM if the bench dies; whatever
  ends the bench (the end of the run, an exception, Ctrl-C, SIGTERM), the groups get SIGTERM,
  then SIGKILL after a grace period.
- **The load** comes from ``--procs`` separate processes (this file with ``--load``), each a
  lean keep-alive HTTP/1.1 client on asyncio streams holding its share of ``--clients``
  connections: a request is pre-encoded bytes, an answer is read by ``Content-Length``. The
  client never shares the server's cores' event loop, so the figure is the server's.
- **The ceiling**: ``--clients`` concurrent ``Journal.append`` calls in this process, on a
  journal of its own (local folder), batch 1, same number of appends. **The floor**: ``GET
  /healthz`` of the same server from the same clients.

Every round runs every path (append and healthz on each server, in-process), in an order
rotating by round, so a busy stretch of the shared machine hits all alike; before each path
the servers are let go quiet (the pipeline digesting earlier appends: relay, processors,
embedder), so that work is charged to no later path. It prints appends/s, p50/p99, the
server process's CPU per request and that of its whole process tree (``memstream up`` with
its broker, Postgres, Valkey and index children: what the machine pays), the group-commit
batch size the server's journal reached (from its ``/metrics``), the ratios (append /
in-process, append / healthz) and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

ACCOUNT = "bench"


# --- the load generator (a separate process) ----------------------------------------------------
class _Conn:
    """One keep-alive HTTP/1.1 connection: send pre-encoded requests, read answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def call(self, request: bytes) -> int:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        start = head.lower().find(b"content-length:")
        if start < 0:
            raise RuntimeError(f"no content-length in {head!r}")
        end = head.find(b"\r\n", start)
        await self.reader.readexactly(int(head[start + 15 : end]))
        return status


def _request(kind: str, key: str, client: int, i: int) -> bytes:
    if kind == "healthz":
        return b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"
    body = json.dumps({"role": "user", "content": f"message {i} from client {client}"}).encode()
    return (
        f"POST /v1/agents/a/threads/t{client}/messages HTTP/1.1\r\nHost: bench\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _client(
    conn: _Conn,
    cmd: dict[str, object],
    c: int,
    per: int,
    want: tuple[int, ...],
    lat: list[float],
    bad: list[int],
    unready: list[int],
) -> None:
    for i in range(per):
        req = _request(str(cmd["kind"]), str(cmd["key"]), c, int(str(cmd["seq"])) + i)
        t = time.perf_counter()
        status = await conn.call(req)
        lat.append(time.perf_counter() - t)
        if status not in want:
            bad.append(status)
        elif status == 503:
            unready[0] += 1


async def _load_main() -> None:
    """Commands on stdin (one JSON per line), one JSON answer per command on stdout."""
    conns: dict[tuple[int, int], _Conn] = {}
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        cmd = json.loads(line)
        port, first, n, per = cmd["port"], cmd["first"], cmd["conns"], cmd["per"]
        # fresh connections, opened before the clock starts: the server closes keep-alive
        # connections idle for 5 s (uvicorn's default), as they are between this server's turns
        for c in range(first, first + n):
            old = conns.pop((port, c), None)
            if old is not None:
                old.writer.close()
            conns[(port, c)] = _Conn(*await asyncio.open_connection("127.0.0.1", port))
        lat: list[float] = []
        bad: list[int] = []
        unready = [0]
        # /healthz answers 503 while a part is not ready (a broker coordinator moving on a
        # loaded machine): still the floor's work, counted apart
        want = (201,) if cmd["kind"] == "append" else (200, 503)
        cpu, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(
            *(
                _client(conns[(port, c)], cmd, c, per, want, lat, bad, unready)
                for c in range(first, first + n)
            )
        )
        t1 = time.perf_counter()
        cpu = time.process_time() - cpu
        out = {"t0": t0, "t1": t1, "lat": lat, "bad": bad[:5], "cpu": cpu, "503": unready[0]}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


_PG_XACTS = """
import asyncio, sys, asyncpg
async def main():
    c = await asyncpg.connect(sys.argv[1])
    print(await c.fetchval(
        "SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database"))
    await c.close()
asyncio.run(main())
"""


# --- the bench (the parent process) -------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
#: a server still running this long after SIGTERM gets SIGKILL
STOP_GRACE_S = 60.0


def _sigterm_with_parent() -> Callable[[], None] | None:
    """What a child runs before exec so it gets SIGTERM when the bench dies, even by SIGKILL
    (when no ``finally`` runs); None off Linux. libc is looked up here, in the parent."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl

    def setup() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return setup


def spawn_group(argv: list[str], **popen: object) -> subprocess.Popen[str]:
    """``argv`` as the leader of a new session (process group): a Ctrl-C of the terminal
    reaches only the bench, which then stops the group with :func:`stop_group`."""
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        argv,
        start_new_session=True,
        preexec_fn=_sigterm_with_parent(),  # noqa: PLW1509 - one prctl call
        text=True,
        **popen,
    )


def stop_group(procs: list[subprocess.Popen[str]], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group of each of ``procs`` (at once), then SIGKILL the groups still
    there after ``grace_s``. Idempotent."""

    def signal_groups(sig: signal.Signals) -> None:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)  # the leader's pid is the group id

    signal_groups(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
    signal_groups(signal.SIGKILL)  # the leader's children too, had it left any behind
    for p in procs:
        p.wait()


class Stopped(SystemExit):
    """SIGTERM or SIGINT arrived: unwinds the bench through its ``finally`` blocks."""


@contextlib.contextmanager
def stops_on_exit(stop: Callable[[], None]) -> Iterator[None]:
    """Run ``stop`` however the block ends: normally, by an exception, or by SIGTERM/SIGINT
    (turned into :class:`Stopped`, exit status 128 + signal); a second signal during
    ``stop`` is ignored, so the clean-up is not cut short."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise Stopped(128 + signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)
        try:
            stop()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


@dataclass
class Up:
    """One ``memstream up`` subprocess, its source tree first on PYTHONPATH."""

    name: str
    src: Path
    env: dict[str, str]
    data_dir: Path
    key: str = field(default_factory=lambda: "bk_" + secrets.token_hex(16))
    proc: subprocess.Popen[str] | None = None
    port: int = 0

    def start(self, timeout: float = 240) -> None:
        env = {
            **os.environ,
            **self.env,
            "PYTHONPATH": str(self.src.resolve()),
            "MEMSTREAM_API_KEYS": f"{ACCOUNT}:{self.key}",
        }
        log = (self.data_dir.parent / f"{self.name}-up.log").open("w")
        self.proc = spawn_group(
            [sys.executable, "-m", "memstream", "up", "--data-dir", str(self.data_dir)]
            + ["--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        got = threading.Event()
        url: list[str] = []

        def drain() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("memstream ready at "):
                    url.append(line.split(" at ", 1)[1].strip())
                    got.set()
            got.set()

        threading.Thread(target=drain, daemon=True).start()
        if not got.wait(timeout) or not url:
            self.stop()
            raise RuntimeError(f"memstream up ({self.name}) never got ready; see {log.name}")
        self.port = int(url[0].rsplit(":", 1)[1])

    def cpu(self) -> float:
        """CPU seconds of the ``memstream up`` process (not its servers) so far."""
        assert self.proc is not None
        return _cpu_s(psutil.Process(self.proc.pid))

    def tree_cpu(self) -> float:
        """CPU seconds so far of ``memstream up`` and every live process under it (the
        broker, Postgres and its backends, Valkey, the index children): what the whole
        server costs the machine. A process that exited meanwhile is not counted."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        total = 0.0
        for p in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):  # exited since the listing
                total += _cpu_s(p)
        return total

    def batches(self) -> tuple[float, float]:
        """(group commits, messages committed) from the server's /metrics."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        got = {"count": 0.0, "sum": 0.0}
        for line in text.splitlines():
            for k in got:
                if line.startswith(f"memstream_journal_group_commit_batch_size_{k} "):
                    got[k] = float(line.split()[1])
        return got["count"], got["sum"]

    def pg_transactions(self) -> int:
        """Transactions the server's Postgres has run so far (every query is one)."""
        dsn = json.loads((self.data_dir / "memstream.json").read_text())["postgres_dsn"]
        out = subprocess.run(
            [sys.executable, "-c", _PG_XACTS, dsn], capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    def stop(self) -> None:
        """Stop the server and everything in its process group (idempotent)."""
        if self.proc is not None:
            stop_group([self.proc])


def _cpu_s(p: psutil.Process) -> float:
    """A process's own CPU seconds (user + system; its reaped children not counted)."""
    t = p.cpu_times()
    return float(t.user + t.system)


class Load:
    """``procs`` load-generator processes sharing the clients between them."""

    def __init__(self, procs: int, clients: int) -> None:
        self.clients = clients
        self.unready = 0  # /healthz answers 503 (not ready), over the whole run
        self.procs = [
            spawn_group(
                [sys.executable, __file__, "--load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            for _ in range(procs)
        ]

    def run(
        self, port: int, kind: str, key: str, per: int, seq: int
    ) -> tuple[float, list[float], float]:
        """(requests/s, latencies, client CPU s) of ``clients`` x ``per`` requests."""
        share = self.clients // len(self.procs)
        for i, p in enumerate(self.procs):
            assert p.stdin is not None
            cmd = {"port": port, "kind": kind, "key": key, "per": per, "seq": seq}
            p.stdin.write(json.dumps({**cmd, "first": i * share, "conns": share}) + "\n")
            p.stdin.flush()
        outs = []
        for p in self.procs:
            assert p.stdout is not None
            outs.append(json.loads(p.stdout.readline()))
        bad = [b for o in outs for b in o["bad"]]
        if bad:
            raise RuntimeError(f"{kind}: unexpected statuses {bad}")
        wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
        lat = [x for o in outs for x in o["lat"]]
        self.unready += sum(o["503"] for o in outs)
        return len(lat) / wall, lat, sum(o["cpu"] for o in outs)

    def close(self) -> None:
        """End of input: each generator exits after its current command; any still there
        after 10 s is stopped (idempotent)."""
        for p in self.procs:
            assert p.stdin is not None
            with contextlib.suppress(OSError):
                p.stdin.close()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        stop_group(self.procs, grace_s=5)


def _settle(servers: list[Up], quiet: float = 0.2, most_s: float = 30.0) -> None:
    """Wait until every server's process uses under ``quiet`` of a core (0.5 s windows),
    at most ``most_s``."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        before = [s.cpu() for s in servers]
        time.sleep(0.5)
        if all(s.cpu() - b < quiet * 0.5 for s, b in zip(servers, before, strict=True)):
            return


async def _in_process(
    journal: object, clients: int, per: int, seq: int
) -> tuple[float, list[float]]:
    from memstream.infra.journal import Journal
    from memstream.schemas.records import NewMessage, ThreadRef

    assert isinstance(journal, Journal)
    lat: list[float] = []

    async def one(c: int) -> None:
        ref = ThreadRef(ACCOUNT, "a", f"t{c}")
        for i in range(per):
            t = time.perf_counter()
            await journal.append(ref, [NewMessage("user", f"message {seq + i} from client {c}")])
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(clients)))
    return len(lat) / (time.perf_counter() - t0), lat


@dataclass
class Path_:
    rates: list[float] = field(default_factory=list)
    lat: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    tree_cpu: float = 0.0
    client_cpu: float = 0.0
    n: int = 0
    xacts: int = 0
    batches: float = 0.0
    messages: float = 0.0


def _stop_servers(servers: list[Up]) -> None:
    """Stop every server (all at once: each stop waits for a clean shutdown)."""
    stop_group([s.proc for s in servers if s.proc is not None])


def _source_at(ref: str, into: Path) -> Path:
    """This repository's ``src`` as of git ``ref``, extracted under ``into``."""
    repo = Path(__file__).resolve().parent.parent
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", ref, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def server_args(ap: argparse.ArgumentParser) -> None:
    """The options naming the servers a bench starts (:func:`servers_of` reads them)."""
    ap.add_argument("--server", action="append", help="NAME=SRC (repeatable); default now=src")
    ap.add_argument("--env", action="append", default=[], help="K=V for every server")
    ap.add_argument(
        "--server-env", action="append", default=[], help="NAME:K=V for one server (repeatable)"
    )
    ap.add_argument("--before", metavar="REF", help="add a server 'before' on git REF's src")


def servers_of(args: argparse.Namespace, work: Path) -> list[Up]:
    """The ``memstream up`` servers :func:`server_args`' options ask for, data under ``work``."""
    env = dict(kv.split("=", 1) for kv in args.env)
    named = [s.split("=", 1) for s in args.server or ["now=src"]]
    if args.before:
        named.append(["before", str(_source_at(args.before, work / "before-src"))])
    per_server: dict[str, dict[str, str]] = {}
    for item in args.server_env:  # NAME:K=V
        name, kv = item.split(":", 1)
        k, v = kv.split("=", 1)
        per_server.setdefault(name, {})[k] = v
    return [
        Up(name, Path(src), {**env, **per_server.get(name, {})}, work / name) for name, src in named
    ]


def run_with(servers: list[Up], body: Callable[[list[Load]], Coroutine[Any, Any, None]]) -> None:
    """Run ``body`` (given the list it adds its load generators to) and stop every server
    and generator however it ends (see :func:`stops_on_exit`)."""
    loads: list[Load] = []

    def stop() -> None:
        for load in loads:
            load.close()
        _stop_servers(servers)

    with stops_on_exit(stop):
        asyncio.run(body(loads))


def bench(args: argparse.Namespace) -> None:
    """Build the servers and run :func:`main` on them."""
    work = Path(tempfile.mkdtemp(prefix="httpappend-"))
    servers = servers_of(args, work)
    run_with(servers, lambda loads: main(args, work, servers, loads))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


async def main(args: argparse.Namespace, work: Path, servers: list[Up], loads: list[Load]) -> None:
    """The run; ``loads`` gets the load generator, so the caller can stop it too."""
    from memstream.clock import SystemClock
    from memstream.infra.journal import Journal, local_store

    journal = await Journal.open(local_store(work / "inproc"), "journal", clock=SystemClock())
    load = Load(args.procs, args.clients)
    loads.append(load)
    paths: dict[str, Path_] = {}
    try:
        for up in servers:  # one at a time: two brokers starting at once on 2 cores time out
            up.start()
        seq = 0
        for r in range(args.rounds + 1):  # round 0 warms up (connections, caches, threads)
            steps: list[tuple[str, Up | None, str]] = [("in-process", None, "append")]
            for s in servers:
                steps += [(f"append {s.name}", s, "append"), (f"healthz {s.name}", s, "healthz")]
            steps = steps[r % len(steps) :] + steps[: r % len(steps)]
            for name, srv, kind in steps:
                p = paths.setdefault(name, Path_())
                # the pipeline digests earlier appends after their phase ended (relay,
                # processors, embedder): let it finish, so its CPU lands on no later phase
                await asyncio.to_thread(_settle, servers)
                b0: tuple[float, float]  # (group commits, messages) before the phase, and after
                b1: tuple[float, float]
                if srv is None:
                    b0 = (journal.stats.batches, journal.stats.messages)
                    rate, lat = await _in_process(journal, args.clients, args.per_client, seq)
                    cpu_s = tree_s = client_s = 0.0
                    xacts = 0
                    b1 = (journal.stats.batches, journal.stats.messages)
                else:
                    b0, x0 = srv.batches(), srv.pg_transactions()
                    c0, t0 = srv.cpu(), srv.tree_cpu()
                    rate, lat, client_s = await asyncio.to_thread(
                        load.run, srv.port, kind, srv.key, args.per_client, seq
                    )
                    cpu_s, tree_s = srv.cpu() - c0, srv.tree_cpu() - t0
                    b1, xacts = srv.batches(), srv.pg_transactions() - x0
                seq += args.per_client
                if r == 0:
                    continue
                p.rates.append(rate)
                p.lat += lat
                p.server_cpu += cpu_s
                p.tree_cpu += tree_s
                p.client_cpu += client_s
                p.n += len(lat)
                p.xacts += xacts
                p.batches += b1[0] - b0[0]
                p.messages += b1[1] - b0[1]
    finally:
        load.close()
        _stop_servers(servers)
        await journal.close()
    load1, load5, _ = os.getloadavg()
    n = args.clients * args.per_client
    print(
        f"{args.clients} clients ({args.procs} load process(es)), {n} batch-1 requests per path "
        f"x {args.rounds} rounds (interleaved); load average {load1:.1f} / {load5:.1f} (1/5 min)"
    )
    print(
        f"{'path':<16} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'srv CPU ms':>10} "
        f"{'tree CPU ms':>11} {'cli CPU ms':>10} {'msgs/commit':>11} {'pg xact/req':>11}"
    )
    for name, p in paths.items():
        per_commit = f"{p.messages / p.batches:11.1f}" if p.batches else f"{'':>11}"
        print(
            f"{name:<16} {statistics.median(p.rates):7.0f} {_pct(p.lat, 0.5):7.1f} "
            f"{_pct(p.lat, 0.99):7.1f} {p.server_cpu / p.n * 1e3:10.3f} "
            f"{p.tree_cpu / p.n * 1e3:11.3f} {p.client_cpu / p.n * 1e3:10.3f} {per_commit} "
            f"{p.xacts / p.n:11.3f}"
        )
    if load.unready:
        print(f"/healthz answered 503 (a part not ready) {load.unready} times")
    ceiling = statistics.median(paths["in-process"].rates)
    for s in servers:
        a = statistics.median(paths[f"append {s.name}"].rates)
        h = statistics.median(paths[f"healthz {s.name}"].rates)
        print(
            f"{s.name}: append / in-process {a / ceiling:.3f} (target >= 0.3), "
            f"append / healthz {a / h:.2f} (target >= 0.8)"
        )
    if len(servers) > 1:
        base = statistics.median(paths[f"append {servers[0].name}"].rates)
        for s in servers[1:]:
            other = statistics.median(paths[f"append {s.name}"].rates)
            print(f"append {servers[0].name} / {s.name}: {base / other:.2f}x")


if __name__ == "__main__":
    if sys.argv[1:] == ["--load"]:
        asyncio.run(_load_main())
        sys.exit(0)
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--per-client", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--procs", type=int, default=1)
    server_args(ap)
    with contextlib.suppress(KeyboardInterrupt):
        bench(ap.parse_args())
