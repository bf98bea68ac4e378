"""Issue 16 item 4 ("durable without Java"): the journal is the authority, so a broker that
lost its log is rebuilt from it. ``memstream up`` runs under load, is stopped, its broker's
log dir is wiped (what Tansu's in-memory build does on every restart, or a lost disk), and it
starts again on the brand-new empty broker. The relay must notice and re-publish the journal,
the processors (new consumer groups: the offsets died with the broker) must converge with
nothing applied twice, and ``memstream lag`` must report true values: never lag 0 and gap 0
while records of the journal are still missing from a projection.

Checked against the ledger of acknowledged writes (``tests.chaos.harness``): every message
once in search, counters plus summaries equal to each thread's length, every memory once in
Postgres and in recall, the journal intact, no dead letter.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from memstream.infra.embedded.kafka import choose_broker
from tests.chaos import harness as h

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.chaos]


async def lag_rows(up: h.Up) -> list[dict[str, object]] | None:
    res = await asyncio.to_thread(up.cli, "lag", "--json", timeout=60)
    if res.returncode != 0:
        return None
    rows = json.loads(res.stdout)
    assert isinstance(rows, list)
    return rows


def journal_ends(rows: list[dict[str, object]]) -> dict[str, int]:
    """Per group, the records its journal topic holds (sum of the partitions' end offsets)."""
    out: dict[str, int] = {}
    for r in rows:
        # consumer rows only (``relay:journal`` counts what is not on the topic yet)
        if str(r["topic"]).endswith("journal") and r["kind"] == "consumer":
            end = r["end_offset"]
            assert isinstance(end, int)
            out[str(r["group"])] = out.get(str(r["group"]), 0) + end
    return out


@pytest.mark.timeout(400)
@pytest.mark.parametrize("broker", ["tansu", pytest.param("kafka", marks=pytest.mark.slow)])
async def test_a_restart_on_a_fresh_empty_broker_converges_complete_and_undoubled(
    traversable_tmp: Path, broker: str
) -> None:
    """Tansu (the broker without Java) keeps nothing across a restart: every restart is on
    a fresh broker. Apache Kafka's log dir is wiped between the stop and the start (two JVM
    starts: ~2 min on a loaded 2-core box, about 1 on a quiet one; it is the case a user of
    a real broker meets, so it runs in every suite)."""
    if broker == "kafka" and choose_broker("auto") != "kafka":
        pytest.skip("needs java and mvn")
    data = traversable_tmp / f"fresh-broker-{broker}-{id(object())}"
    up = h.Up(data, env={"MEMSTREAM_KAFKA_BROKER": broker})
    ledger = h.Ledger()
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {what}")  # noqa: T201 - phase times (-s)

    up.start()
    mark("up")
    await h.bind_memory(up.url)
    try:
        stop = asyncio.Event()
        await h.load(lambda: up.url, ledger, stop, threads=5, concurrency=4, max_messages=80)
        mark("loaded")
        first = ledger.acknowledged_messages()

        up.stop()
        broker_dir = data / "kafka"
        if broker_dir.exists():
            shutil.rmtree(broker_dir)  # the broker's whole log: topics, offsets, dead letters
        up.start()
        mark("up again on a fresh broker")
        log_text = up.log.read_text(encoding="utf-8")
        assert "lost its log; re-publishing the journal from seq 1" in log_text, log_text[-3000:]

        # appends go on while the relay re-publishes and the new groups re-apply
        stop = asyncio.Event()
        loader = asyncio.create_task(
            h.load(lambda: up.url, ledger, stop, threads=5, concurrency=2, max_messages=120)
        )
        seen: list[list[dict[str, object]]] = []
        while not loader.done():
            rows = await lag_rows(up)
            if rows is not None:
                seen.append(rows)
        await loader
        mark(f"loaded again ({len(seen)} lag readings)")
        assert seen, "memstream lag never answered during the rebuild"
        # `memstream lag` never invents a gap (the old broker's coverage is not the new one's)
        false_gaps = [r for rows in seen for r in rows if r["gap"] not in (0, None)]
        assert false_gaps == [], false_gaps[:5]

        await h.converge(up)
        mark("converged again")
        rows = await lag_rows(up)
        assert rows and all(r["lag"] == 0 and r["gap"] == 0 for r in rows), rows
        assert all(r["state"] == "running" for r in rows), rows  # the processors' loops
        # the new broker holds the whole journal again (re-published, not only the new part:
        # every message plus the threads' creation events)
        again = journal_ends(rows)
        assert again and all(n > ledger.acknowledged_messages() for n in again.values()), again
        assert ledger.acknowledged_messages() > first
        report = h.Report()
        await h.check_live(up, ledger, report)  # once each: re-applied, nothing doubled
        assert report.ok(), "\n".join(report.lines())
        assert report.dead_letters == [], report.dead_letters[:3]
        mark("checked")
    finally:
        up.stop()
    report = h.Report()
    await h.check_journal(data, ledger, report)
    assert report.ok(), "\n".join(report.lines())
