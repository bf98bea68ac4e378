"""The chaos harness (issue 12): ``memstream up`` as a subprocess, load through the public
HTTP API with a ledger of what was acknowledged, faults, convergence, and the checks.

Used by ``tests/chaos/test_chaos.py`` (bounded, marked ``chaos``) and ``bench/soak.py``
(the long form). Nothing here fakes an engine: the faults are real signals to real
processes (the broker's JVM, Postgres, Valkey, ``memstream up`` itself).

The checks compare the stores with the ledger of **acknowledged** writes (a 2xx answer):

- journal: every acknowledged message once, at its offset (read from the journal itself
  once ``up`` is stopped: :func:`check_journal`);
- ClickHouse / search: a search for each message's unique word finds it exactly once;
- counters and summaries: the thread's counted messages plus what its summary covers equal
  its length (nothing counted twice or missed), and a summary covers a prefix of the thread;
- memory: every acknowledged key once in Postgres (the entries list) with its last
  acknowledged content, and found by recall (the index);
- dead letters: only those a fault put there on purpose (:data:`Report.dead_letters`).

A write whose answer was lost (the connection dropped by a kill) is not acknowledged: it may
or may not be stored, and is reported as found in the ``unacked`` row when it is (thread
lengths for the counters check are read from the journal, so such a message counted is not a
double), never as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil

if TYPE_CHECKING:
    from memstream.infra.embedded.base import EmbeddedServer

KEY = "chaos-key-0123456789"
ACCOUNT = "chaos"
AGENT = "loadbot"


def word(n: int) -> str:
    """A unique word for ``n``: ``w`` + 12 hex digits of its hash. Words with digits are
    never stemmed by the analyzer, and hashes of different numbers share no long run of
    characters, so a search's fuzzy matches stay below the exact one."""
    return "w" + hashlib.blake2b(str(n).encode(), digest_size=6).hexdigest()


# --- memstream up ------------------------------------------------------------------------------
class Up:
    """``memstream up`` on ``data_dir`` as a subprocess (its output drained to a log file)."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        # The harness owns child restarts (restart_child): with up's own keeper also on, two
        # brokers raced for one port. The keeper's restarts are tested in test_readiness.py.
        self.env = {
            **os.environ,
            "MEMSTREAM_API_KEYS": f"{ACCOUNT}:{KEY}",
            "MEMSTREAM_SERVER_RESTART_TRIES": "0",
            # Keyword search only, unless a test turns the dense side on (test_up_kill9):
            # check_live proves each message is in the ClickHouse projection once by its
            # unique word, and dense neighbours of a 20-word query crowd the 50 results, so
            # every word was asked again alone while the embedder took a core of two
            # (test_chaos went from ~100 s to past its 300 s bound when dense became the
            # default). The dense side's own rows are checked by test_up_kill9.
            "MEMSTREAM_TRANSCRIPT_DENSE": "false",
            **(env or {}),
        }
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.log = data_dir.parent / f"{data_dir.name}-up.log"

    def start(self, timeout: float = 180) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", "up", "--data-dir", str(self.data_dir)]
            + ["--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        self.proc = proc
        assert proc.stdout is not None
        ready: list[str] = []
        got = threading.Event()
        logf = self.log.open("a", encoding="utf-8")

        def drain() -> None:  # keeps the pipe from filling up while up runs
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                logf.flush()
                if line.startswith("memstream ready at ") and not got.is_set():
                    ready.append(line.split(" at ", 1)[1].strip())
                    got.set()
            logf.close()
            got.set()

        threading.Thread(target=drain, daemon=True).start()
        if not got.wait(timeout) or not ready:
            proc.kill()
            tail = self.log.read_text(encoding="utf-8")[-4000:]
            raise AssertionError(f"memstream up never got ready:\n{tail}")
        self.url = ready[0]
        return self.url

    async def task_dump(self, wait_s: float = 2.0) -> str:
        """What every asyncio task of up awaits (``kill -USR2``), read back from its log:
        where a processor that stopped moving is stuck."""
        from memstream.infra.task_dump import BEGIN, END

        if self.proc is None or self.proc.poll() is not None:
            return "(memstream up is not running: no task dump)"
        self.proc.send_signal(signal.SIGUSR2)
        await asyncio.sleep(wait_s)
        text = self.log.read_text(encoding="utf-8", errors="replace")
        start = text.rfind(BEGIN)
        if start < 0:
            return "(no task dump in up's log)"
        end = text.find(END, start)
        return text[start : end + len(END) if end >= 0 else None]

    def state(self) -> dict[str, object]:
        raw = json.loads((self.data_dir / "memstream.json").read_text(encoding="utf-8"))
        assert isinstance(raw, dict)
        return raw

    def child(self, name: str) -> psutil.Process:
        """The child server ``name`` (``kafka``, ``postgres``, ``valkey``)."""
        assert self.proc is not None
        for c in psutil.Process(self.proc.pid).children():
            cmd = " ".join(c.cmdline())
            if name == "kafka" and "java" in c.name() and "kafka" in cmd:
                return c
            if name == "postgres" and c.name().startswith("postgres"):
                return c
            if name == "valkey" and ("valkey" in c.name() or "redis" in c.name()):
                return c
        raise LookupError(f"no {name} child of memstream up")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)
        time.sleep(0.5)  # its servers die with it (PR_SET_PDEATHSIG)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memstream", *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            check=False,
            text=True,
            timeout=timeout,
            env=self.env,
        )


class Worker:
    """``memstream worker NAMES`` beside ``up`` on its data dir, against up's servers (read
    from its state file), output to a log file. Scale-out and processor crashes."""

    def __init__(self, up: Up, names: list[str], tag: str) -> None:
        self.up = up
        self.names = names
        self.log = up.data_dir.parent / f"{up.data_dir.name}-worker-{tag}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        st = self.up.state()
        env = {
            **self.up.env,
            "MEMSTREAM_KAFKA_BOOTSTRAP": str(st["kafka_bootstrap"]),
            "MEMSTREAM_POSTGRES_DSN": str(st["postgres_dsn"]),
            "MEMSTREAM_REDIS_URL": str(st["redis_url"]),
        }
        with self.log.open("ab") as out:
            start = out.tell()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memstream", "worker", *self.names]
                + ["--data-dir", str(self.up.data_dir)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[start:].decode("utf-8", "replace")
            if "memstream worker ready" in text:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.kill9()
        tail = self.log.read_text(encoding="utf-8", errors="replace")[-4000:]
        raise AssertionError(f"memstream worker {self.names} never got ready:\n{tail}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM: the worker finishes its batches, commits and leaves its groups."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill9()


async def bind_memory(url: str) -> None:
    """Give the load's agent the Memory capability (once, after the first start)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as client:
        r = await client.put(f"{url}/v1/agents/{AGENT}", json={"memory": True})
        assert r.status_code == 200, r.text


# --- the ledger and the load -------------------------------------------------------------------
@dataclass
class Ledger:
    """What was acknowledged. ``messages[thread][offset] = content``."""

    messages: dict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    memories: dict[str, str] = field(default_factory=dict)  # key -> last acknowledged content
    sent_messages: set[str] = field(default_factory=set)  # every content sent (acked or not)
    searched: set[tuple[str, int]] = field(default_factory=set)  # found once by a check
    failed: int = 0
    appends_ok: int = 0
    stores_ok: int = 0
    counter: int = 0

    def next_word(self) -> str:
        self.counter += 1
        return word(self.counter)

    def acknowledged_messages(self) -> int:
        return sum(len(m) for m in self.messages.values())


async def load(
    url: Callable[[], str],
    ledger: Ledger,
    stop: asyncio.Event,
    *,
    threads: int,
    memory_every: int = 5,
    concurrency: int = 8,
    max_messages: int | None = None,
) -> None:
    """Append one message at a time to random threads (``concurrency`` writers), and every
    ``memory_every``-th write a memory store, until ``stop`` (or ``max_messages`` acked).
    ``url()`` is read per request: a restarted ``up`` has a new address."""
    rnd = random.Random(12)

    async def writer(i: int) -> None:
        n = 0
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {KEY}"}, timeout=10.0
        ) as client:
            while not stop.is_set():
                if max_messages is not None and ledger.appends_ok >= max_messages:
                    return
                n += 1
                w = ledger.next_word()
                try:
                    if memory_every and n % memory_every == 0:
                        key = f"k{rnd.randrange(threads * 4)}"
                        content = f"the chaos fact {w} for {key}"
                        r = await client.post(
                            f"{url()}/v1/agents/{AGENT}/memory/store",
                            json={
                                "key": key,
                                "content": content,
                                "category": "project_fact",
                                "scope": "shared",
                            },
                        )
                        if r.status_code == 200:
                            ledger.memories[key] = content
                            ledger.stores_ok += 1
                        else:
                            ledger.failed += 1
                        continue
                    thread = f"t{rnd.randrange(threads)}"
                    content = f"message {w} in {thread}"
                    ledger.sent_messages.add(content)
                    r = await client.post(
                        f"{url()}/v1/agents/{AGENT}/threads/{thread}/messages",
                        json={"role": "user", "content": content},
                    )
                    if r.status_code == 201:
                        off = r.json()["appended"][0]["offset"]
                        ledger.messages[thread][off] = content
                        ledger.appends_ok += 1
                    else:
                        ledger.failed += 1
                except (httpx.HTTPError, OSError):
                    ledger.failed += 1
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(writer(i) for i in range(concurrency)))


# --- convergence -------------------------------------------------------------------------------
async def converge(up: Up, timeout: float = 180) -> float:
    """Seconds until every processor's lag and gap read 0 (``memstream lag --json``)."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        res = await asyncio.to_thread(up.cli, "lag", "--json", timeout=60)
        if res.returncode == 0:
            rows = json.loads(res.stdout)
            last = res.stdout
            if rows and all(r["lag"] == 0 and r["gap"] == 0 for r in rows):
                return time.monotonic() - t0
        else:
            last = res.stderr
        await asyncio.sleep(1.0)
    raise AssertionError(f"no convergence in {timeout}s: {_behind(last)}\n{await up.task_dump()}")


def _behind(lag_output: str) -> list[str]:
    """The rows of a ``memstream lag --json`` output not at lag 0 and gap 0 (or the output's
    tail when it is not rows: an error)."""
    if not lag_output.startswith("["):
        return [lag_output[-2000:]]
    return [
        f"{r['group']}[{r['partition']}] lag {r['lag']} gap {r['gap']} ({r['state']})"
        for r in json.loads(lag_output)
        if isinstance(r, dict) and (r.get("lag") or r.get("gap"))
    ]


# --- checks ------------------------------------------------------------------------------------
@dataclass
class StoreCount:
    acknowledged: int = 0
    found: int = 0
    lost: int = 0
    doubled: int = 0
    examples: list[str] = field(default_factory=list)

    def miss(self, what: str) -> None:
        self.lost += 1
        if len(self.examples) < 5:
            self.examples.append(f"lost {what}")

    def double(self, what: str) -> None:
        self.doubled += 1
        if len(self.examples) < 5:
            self.examples.append(f"doubled {what}")


@dataclass
class Report:
    stores: dict[str, StoreCount] = field(default_factory=dict)
    dead_letters: list[dict[str, object]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def store(self, name: str) -> StoreCount:
        return self.stores.setdefault(name, StoreCount())

    def ok(self) -> bool:
        return not self.problems and all(
            s.lost == 0 and s.doubled == 0 for s in self.stores.values()
        )

    def lines(self) -> list[str]:
        out = [
            f"{name:<10} acknowledged {s.acknowledged:>8} found {s.found:>8} lost {s.lost:>4} "
            f"doubled {s.doubled:>4} {'; '.join(s.examples)}"
            for name, s in self.stores.items()
        ]
        shown = [f"problem: {p}" for p in self.problems[:20]]
        if len(self.problems) > 20:
            shown.append(f"... and {len(self.problems) - 20} more problems")
        return out + shown


async def check_live(
    up: Up,
    ledger: Ledger,
    report: Report,
    *,
    sample: int | None = None,
    only_new: bool = False,
) -> None:
    """Search (ClickHouse), memory (Postgres, index), counters/summaries and dead letters,
    through the running system. ``sample`` limits the messages searched (the soak);
    ``only_new`` searches only messages not found by an earlier check."""
    rnd = random.Random(5)
    async with httpx.AsyncClient(
        base_url=up.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30.0
    ) as c:
        # search: each acknowledged message exactly once (20 unique words per query:
        # a message matches on any word, so every one of them is in the 50 results)
        search = report.store("search")
        items = [
            (t, o, m)
            for t, msgs in ledger.messages.items()
            for o, m in msgs.items()
            if not only_new or (t, o) not in ledger.searched
        ]
        if sample is not None and len(items) > sample:
            items = rnd.sample(items, sample)
        sem = asyncio.Semaphore(4)

        async def query(words: list[str]) -> dict[str, list[tuple[str, int]]] | None:
            async with sem:
                r = await c.post(
                    f"/v1/agents/{AGENT}/journal/search",
                    json={"query": " ".join(words), "limit": 50, "summarize": False},
                )
            if r.status_code != 200:
                report.problems.append(f"search answered {r.status_code}: {r.text[:200]}")
                return None
            found: dict[str, list[tuple[str, int]]] = defaultdict(list)
            for hit in r.json()["results"]:
                for w in hit["content"].split():
                    found[w].append((hit["thread_id"], hit["offset"]))
            return found

        async def batch(part: list[tuple[str, int, str]]) -> None:
            words = [m.split()[1] for _, _, m in part]
            found = await query(words)
            if found is None:
                return
            for (thread, offset, _), w in zip(part, words, strict=True):
                where = found.get(w, [])
                if not where:  # crowded out by fuzzy matches of the others? ask alone
                    alone = await query([w])
                    where = [] if alone is None else alone.get(w, [])
                search.acknowledged += 1
                if not where:
                    search.miss(f"{thread}@{offset}")
                elif len(where) > 1:
                    search.double(f"{thread}@{offset} x{len(where)}")
                elif where[0] != (thread, offset):
                    report.problems.append(f"{w} found at {where[0]}, not {(thread, offset)}")
                else:
                    search.found += 1
                    ledger.searched.add((thread, offset))

        await asyncio.gather(*(batch(items[i : i + 10]) for i in range(0, len(items), 10)))

        # memory: entries (Postgres) once each with the last acknowledged content
        pg = report.store("postgres")
        seen: dict[str, list[str]] = defaultdict(list)
        cursor: str | None = None
        while True:
            params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
            r = await c.get(f"/v1/agents/{AGENT}/memory/entries", params=params)
            if r.status_code != 200:
                report.problems.append(f"entries answered {r.status_code}: {r.text[:200]}")
                break
            page = r.json()
            for e in page["entries"]:
                seen[e["key"]].append(e["content"])
            cursor = page["next_cursor"]
            if not cursor:
                break
        for key, content in ledger.memories.items():
            pg.acknowledged += 1
            got = seen.get(key, [])
            if len(got) > 1:
                pg.double(key)
            elif not got:
                pg.miss(key)
            elif got[0] != content:
                # a later store whose answer was lost may have replaced it: not a loss
                pg.found += 1
            else:
                pg.found += 1

        # the index: recall finds each acknowledged memory by its unique word, once
        idx = report.store("index")
        for key, content in ledger.memories.items():
            w = content.split()[3]
            r = await c.post(f"/v1/agents/{AGENT}/memory/recall", json={"query": w, "limit": 5})
            if r.status_code != 200:
                report.problems.append(f"recall answered {r.status_code}: {r.text[:200]}")
                continue
            idx.acknowledged += 1
            keys = [
                x["entry"]["key"] if "entry" in x else x.get("key") for x in r.json()["results"]
            ]
            n = keys.count(key)
            if n == 0 and seen.get(key, [""])[0] == content:
                idx.miss(key)
            elif n > 1:
                idx.double(key)
            else:
                idx.found += 1

        # counters and summaries: counted + summarized == thread length. The length is the
        # journal's: a write whose answer a fault lost may be stored (and counted) after the
        # last acknowledged one; only a message the load never sent would be foreign.
        cnt = report.store("counters")
        lengths = await journal_lengths(up.data_dir, ledger, report)
        for thread, msgs in ledger.messages.items():
            length = lengths.get(thread, max(msgs) + 1 if msgs else 0)
            r = await c.get(f"/v1/agents/{AGENT}/threads/{thread}/summary")
            covered = 0
            if r.status_code == 200:
                s = r.json()
                covered = s["last_message_offset"] + 1
                if covered > length:
                    report.problems.append(f"{thread}: summary covers {covered} > {length}")
            elif r.status_code != 404:
                report.problems.append(f"summary answered {r.status_code}: {r.text[:200]}")
            counted = await _counted(up, thread)
            cnt.acknowledged += length
            if counted is None:
                report.problems.append(f"{thread}: counters unreadable")
            elif covered + counted < length:
                cnt.lost += length - covered - counted
                cnt.examples.append(f"{thread}: {covered}+{counted} < {length}")
            elif covered + counted > length:
                cnt.doubled += covered + counted - length
                cnt.examples.append(f"{thread}: {covered}+{counted} > {length}")
            else:
                cnt.found += length

    res = await asyncio.to_thread(up.cli, "dlq", "list", "--json")
    if res.returncode == 0:
        report.dead_letters = json.loads(res.stdout)
    else:
        report.problems.append(f"dlq list failed: {res.stderr[-300:]}")


async def journal_lengths(data_dir: Path, ledger: Ledger, report: Report) -> dict[str, int]:
    """Each ledger thread's length in the journal (a read-only follower, so ``up`` may run).
    Messages past the acknowledged ones must be ones the load sent (answer lost to a fault):
    counted as ``unacknowledged_found``; anything else is a problem."""
    from memstream.infra.journal import local_store
    from memstream.infra.journal.reader import JournalReader
    from memstream.schemas.records import ThreadRef

    out: dict[str, int] = {}
    extra = report.store("unacked")
    reader = await JournalReader.open(local_store(data_dir / "journal"), "journal")
    try:
        for thread, msgs in ledger.messages.items():
            acked = max(msgs) + 1 if msgs else 0
            ref = ThreadRef(ACCOUNT, AGENT, thread)
            length = await reader.next_offset(ref)
            if length > acked:
                for m in await reader.read_range(ref, acked, length - 1):
                    if m.content in ledger.sent_messages:
                        extra.found += 1
                    else:
                        report.problems.append(f"{thread}@{m.offset}: a message never sent")
            out[thread] = max(length, acked)
    finally:
        await reader.close()
    return out


async def _counted(up: Up, thread: str) -> int | None:
    """Messages the counters processor counted since the thread's last summary (Redis)."""
    import redis.asyncio as aioredis

    from memstream.infra.thread_state import ThreadState
    from memstream.schemas.records import ThreadRef

    url = up.state().get("redis_url")
    if not isinstance(url, str):
        return None
    r = aioredis.from_url(url)
    try:
        _, messages = await ThreadState(r).counters(ThreadRef(ACCOUNT, AGENT, thread))
        return messages
    except Exception:  # noqa: BLE001 - reported as a problem by the caller
        return None
    finally:
        await r.aclose()


async def check_journal(data_dir: Path, ledger: Ledger, report: Report) -> None:
    """Every acknowledged message once in the journal, at its offset (``up`` stopped)."""
    from memstream.infra.journal import Journal, local_store
    from memstream.schemas.records import ThreadRef

    st = report.store("journal")
    journal = await Journal.open(local_store(data_dir / "journal"), "journal")
    try:
        for thread, msgs in ledger.messages.items():
            got = await journal.last(ThreadRef(ACCOUNT, AGENT, thread), 1_000_000)
            by_content: dict[str, list[int]] = defaultdict(list)
            for m in got:
                by_content[m.content].append(m.offset)
            offsets = [m.offset for m in got]
            if offsets != list(range(len(offsets))):
                report.problems.append(f"{thread}: journal offsets not dense")
            for off, content in msgs.items():
                st.acknowledged += 1
                where = by_content.get(content, [])
                if not where:
                    st.miss(f"{thread}@{off}")
                elif len(where) > 1:
                    st.double(f"{thread}@{off}")
                elif where[0] != off:
                    report.problems.append(f"{thread}: {content!r} at {where[0]}, not {off}")
                else:
                    st.found += 1
    finally:
        await journal.close()


def check_summaries(data_dir: Path, ledger: Ledger, report: Report) -> None:
    """Every summary version of every thread written once: versions dense from 1, each
    covering more of the thread than the last, and each one's message count equal to the
    messages it covers (a span folded twice, or skipped, breaks that). Reads the local
    object store's files, so it runs while ``up`` does."""
    from memstream.infra.summary_store import thread_folder
    from memstream.schemas.records import ThreadRef

    st = report.store("summaries")
    for thread in ledger.messages:
        folder = data_dir / "objects" / thread_folder(ThreadRef(ACCOUNT, AGENT, thread))
        docs: dict[int, dict[str, object]] = {}
        for f in folder.glob("summary.v*.json"):
            doc = json.loads(f.read_text(encoding="utf-8"))
            docs[int(f.name.removeprefix("summary.v").removesuffix(".json"))] = doc
        last = -1
        for v in range(1, len(docs) + 1):
            st.acknowledged += 1
            doc = docs.get(v)
            if doc is None:
                report.problems.append(f"{thread}: summary versions not dense: {sorted(docs)}")
                break
            end, count = doc["last_message_offset"], doc["message_count"]
            assert isinstance(end, int) and isinstance(count, int)
            if end <= last:
                st.double(f"{thread} v{v} ends at {end}, v{v - 1} at {last}")
            elif count != end + 1:
                (st.double if count > end + 1 else st.miss)(
                    f"{thread} v{v}: {count} messages folded for offsets 0..{end}"
                )
            else:
                st.found += 1
            last = end


# --- faults ------------------------------------------------------------------------------------
async def restart_child(up: Up, name: str, wait_s: float = 3.0) -> None:
    """SIGKILL ``up``'s child ``name``; if ``up`` has not brought it back after ``wait_s``,
    start it again on its data dir and port from here (the test then owns it)."""
    proc = up.child(name)
    port = _port(up, name)
    proc.kill()
    with contextlib.suppress(psutil.Error):
        proc.wait(30)
    await asyncio.sleep(wait_s)
    from memstream.infra.embedded.base import port_is_free

    if not port_is_free(port):
        return  # up restarted it itself
    OWNED.append(await _launch(up.data_dir, name, port))


MALFORMED_KEY = f"{ACCOUNT}/{AGENT}/malformed"


def unexpected_letters(letters: list[dict[str, object]]) -> list[dict[str, object]]:
    """Dead letters other than those of :func:`publish_malformed`'s record."""
    return [d for d in letters if d.get("key") != MALFORMED_KEY]


OWNED: list[EmbeddedServer] = []
"""Servers the harness restarted itself (stopped by :func:`stop_owned`)."""


async def stop_owned() -> None:
    while OWNED:
        srv = OWNED.pop()
        with contextlib.suppress(Exception):
            await srv.stop()


def _port(up: Up, name: str) -> int:
    ports = up.state().get("ports")
    assert isinstance(ports, dict)
    key = {"kafka": "kafka", "postgres": "postgres", "valkey": "redis"}[name]
    port = ports.get(key)
    assert isinstance(port, int)
    return port


async def _launch(data_dir: Path, name: str, port: int) -> EmbeddedServer:
    if name == "kafka":
        from memstream.infra.embedded.kafka import ApacheKafkaServer

        srv: EmbeddedServer = ApacheKafkaServer(data_dir / "kafka", port=port)
    elif name == "postgres":
        from memstream.infra.embedded.postgres import EmbeddedPostgres

        srv = EmbeddedPostgres(data_dir / "postgres", port=port)
    else:
        from memstream.infra.embedded.redis import EmbeddedRedis

        srv = EmbeddedRedis(data_dir / "redis", port=port)
    await srv.start()
    return srv


async def publish_malformed(up: Up) -> None:
    """One record that is not an envelope, straight onto the journal topic: every journal
    processor must dead-letter it (and nothing else) and go on."""
    from aiokafka import AIOKafkaProducer

    st = up.state()
    bootstrap = st["kafka_bootstrap"]
    prefix = st.get("topic_prefix") or "memstream."
    assert isinstance(bootstrap, str) and isinstance(prefix, str)
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        await p.send_and_wait(
            f"{prefix}journal", b"\x00 not an envelope", key=MALFORMED_KEY.encode()
        )
    finally:
        await p.stop()


async def add_partitions(up: Up, total: int, topics: tuple[str, ...] = ("journal",)) -> None:
    """Raise the partition count of ``topics`` (suffixes) to ``total`` (Kafka admin
    ``create_partitions``), as an operator scaling out would."""
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

    st = up.state()
    prefix = st.get("topic_prefix") or "memstream."
    assert isinstance(prefix, str)
    admin = AIOKafkaAdminClient(bootstrap_servers=str(st["kafka_bootstrap"]))
    await admin.start()
    try:
        await admin.create_partitions({f"{prefix}{t}": NewPartitions(total) for t in topics})
    finally:
        await admin.close()


async def records_per_partition(up: Up, topic: str = "journal") -> dict[int, int]:
    """How many records each partition of ``topic`` (suffix) holds now."""
    from memstream.streams.lag import end_offsets

    st = up.state()
    prefix = st.get("topic_prefix") or "memstream."
    name = f"{prefix}{topic}"
    starts, highs = await end_offsets(str(st["kafka_bootstrap"]), [name])
    return {tp.partition: n - starts.get(tp, 0) for tp, n in highs.items()}


async def group_members(up: Up, group: str) -> tuple[str, int]:
    """(state, number of members) of consumer group ``group`` (Kafka DescribeGroups)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=str(up.state()["kafka_bootstrap"]))
    await admin.start()
    try:
        (resp,) = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    g = resp.groups[0]  # (error_code, group_id, state, protocol_type, protocol, members, ...)
    return str(g[2]), len(g[5])


async def wait_members(up: Up, groups: tuple[str, ...], members: int, timeout: float = 90) -> float:
    """Seconds until every group in ``groups`` is Stable with ``members`` members."""
    t0 = time.monotonic()
    last: dict[str, tuple[str, int]] = {}
    while time.monotonic() - t0 < timeout:
        for g in groups:
            with contextlib.suppress(Exception):
                last[g] = await group_members(up, g)
        if all(last.get(g) == ("Stable", members) for g in groups):
            return time.monotonic() - t0
        await asyncio.sleep(0.5)
    raise AssertionError(f"groups never reached {members} stable members: {last}")
