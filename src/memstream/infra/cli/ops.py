"""Operator commands: ``memstream lag`` and ``memstream dlq list|retry``.

They talk to Kafka only (the bootstrap comes from ``MEMSTREAM_KAFKA_BOOTSTRAP`` or the
state file of a running ``memstream up``), so they work against any deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from memstream.infra.cli.console_ops import PROCESSOR_TOPICS
from memstream.infra.cli.main import (
    DataDir,
    app,
    err,
    out,
    postgres_dsn_or_exit,
    run,
    settings_for_running,
)
from memstream.schemas.topics import Topics
from memstream.streams.coverage import PartitionKey, Ranges

__all__ = ["PROCESSOR_TOPICS"]

dlq_app = typer.Typer(
    help="Dead letters: events a processor could not handle.", no_args_is_help=True
)
app.add_typer(dlq_app, name="dlq")


def _bootstrap(data_dir: object) -> tuple[str, Topics]:
    s = settings_for_running(data_dir)  # type: ignore[arg-type]
    if not s.kafka_bootstrap:
        err.print("[red]no Kafka address[/]: set MEMSTREAM_KAFKA_BOOTSTRAP or pass --data-dir")
        raise typer.Exit(2)
    return s.kafka_bootstrap, Topics(s.topic_prefix)


def _full_table(title: str, columns: list[str], rows: list[list[str]], fold: str = "") -> Table:
    """A table that never shortens a value a user may have to copy: every column is as wide
    as its longest value, except ``fold``, which wraps (free text such as an error)."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        if col == fold:
            table.add_column(col, overflow="fold", ratio=1)
        else:
            width = max([len(col), *(len(r[i]) for r in rows)])
            table.add_column(col, no_wrap=True, min_width=width)
    for r in rows:
        table.add_row(*r)
    return table


def _print_full(table: Table) -> None:
    """Print at least as wide as the table needs (a pipe is 80 columns to rich)."""
    need = sum((c.min_width or 0) + 3 for c in table.columns) + 1
    fold = any(c.overflow == "fold" for c in table.columns)
    width = max(out.width, need + (30 if fold else 0))
    Console(width=width, force_terminal=out.is_terminal).print(table)


async def _running_report(data_dir: object) -> dict[str, object]:
    """The ``/readyz`` body of the running ``memstream up`` on ``data_dir``; empty when no
    running system answers (processors in a ``memstream worker``: their state shows ``-``)."""
    import httpx

    from memstream.infra.cli.state import read_state

    s = settings_for_running(data_dir)  # type: ignore[arg-type]
    state = read_state(s.resolved_data_dir()) or {}
    url = state.get("api_url")
    if not isinstance(url, str) or not state.get("running"):
        return {}
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            body = (await client.get(f"{url.rstrip('/')}/readyz")).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _processor_states(report: dict[str, object], groups: list[str]) -> dict[str, str]:
    """Per consumer group, its processor's loop state (``running``, ``waiting for
    postgres``...) in the running system's ``/readyz`` report."""
    from memstream.infra.supervisor import describe_snapshot

    loops = report.get("loops")
    if not isinstance(loops, dict):
        return {}
    out: dict[str, str] = {}
    for group in groups:
        name = group.split("-", 1)[1] if "-" in group else group
        snap = loops.get(f"processor:{name}")
        if isinstance(snap, dict):
            out[group] = describe_snapshot(snap)
    return out


RELAY_LOOPS = {"journal": "journal-relay", "memory": "outbox-relay"}
"""The loop (``/readyz`` ``loops``) of each relay, for its ``state``."""


async def _relay_rows(
    report: dict[str, object], dsn: str, topics: Topics
) -> list[dict[str, object]]:
    """One row per relay whose backlog is known: records acknowledged to a caller that are
    not on their topic yet, so no processor's lag can count them (a lag of 0 with a
    backlog is not caught up). The journal relay's from the running system's report; the
    memory outbox's is its unpublished rows in Postgres (``-`` state when no system runs)."""
    from memstream.infra.supervisor import describe_snapshot

    backlogs: dict[str, int] = {}
    relays = report.get("relays")
    if isinstance(relays, dict) and isinstance(relays.get("journal"), int):
        backlogs["journal"] = relays["journal"]
    if dsn:
        n = await _outbox_backlog(dsn)
        if n is not None:
            backlogs["memory"] = n
    loops = report.get("loops")
    rows: list[dict[str, object]] = []
    for relay, backlog in backlogs.items():
        snap = loops.get(RELAY_LOOPS[relay]) if isinstance(loops, dict) else None
        rows.append(
            {
                "kind": "relay",
                "group": f"relay:{relay}",
                "topic": topics.journal if relay == "journal" else topics.memory,
                "partition": None,
                "committed": None,
                "end_offset": None,
                "lag": backlog,
                "since_commit_s": None,
                "gap": 0,
                "state": describe_snapshot(snap) if isinstance(snap, dict) else None,
            }
        )
    return rows


async def _outbox_backlog(dsn: str) -> int | None:
    """Unpublished ``memory_outbox`` rows, or None (with a warning) when Postgres cannot be
    read or has no outbox (a database memstream never migrated)."""
    import asyncpg

    from memstream.agents_ctx.memory.outbox import unpublished_count

    try:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            return await unpublished_count(conn)
        finally:
            await conn.close()
    except asyncpg.UndefinedTableError:
        return None
    except Exception as e:  # noqa: BLE001 - lag without the relay's row is still worth showing
        err.print(f"[yellow]memory relay backlog unknown[/]: cannot read Postgres ({e})")
        return None


def _with_state(rows: list[object], states: dict[str, str]) -> list[dict[str, object]]:
    """The rows as dicts, each with its processor's ``state`` (None when unknown)."""
    out = []
    for r in rows:
        d: dict[str, object] = r.to_dict()  # type: ignore[attr-defined]
        d["kind"] = "consumer"
        d["state"] = states.get(str(d["group"]))
        out.append(d)
    return out


async def _lag_rows(
    data_dir: object,
    rows: list[object],
    groups: list[str],
    dsn: str,
    topics: Topics,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The consumer rows with their processors' states, and the relays' rows."""
    report = await _running_report(data_dir)
    shown = _with_state(rows, _processor_states(report, groups))
    return shown, await _relay_rows(report, dsn, topics)


def _lag_table(rows: list[dict[str, object]]) -> Table:
    cells: list[list[str]] = []
    for d in rows:
        since = d["since_commit_s"]
        cells.append(
            [
                str(d["group"]),
                str(d["topic"]),
                "-" if d["partition"] is None else str(d["partition"]),
                "-" if d["committed"] is None else str(d["committed"]),
                "-" if d["end_offset"] is None else str(d["end_offset"]),
                str(d["lag"]),
                "-" if d["gap"] is None else str(d["gap"]),
                "-" if not isinstance(since, int | float) else f"{since:.1f}s",
                str(d.get("state") or "-"),
            ]
        )
    columns = [
        "group",
        "topic",
        "partition",
        "committed",
        "end",
        "lag",
        "gap",
        "since commit",
        "state",
    ]
    return _full_table("consumer lag", columns, cells)


async def _coverage(dsn: str, groups: list[str]) -> dict[PartitionKey, Ranges] | None:
    """What each group applied (``streams.coverage``), or None (with a warning) when the
    database cannot be read: the gap column then shows ``-``."""
    import asyncpg

    from memstream.infra.coverage_store import PgCoverage

    if not dsn:
        return None
    try:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, timeout=5)
        try:
            return await PgCoverage(pool).load_groups(groups)
        finally:
            await pool.close()
    except Exception as e:  # noqa: BLE001 - lag without gaps is still worth showing
        err.print(f"[yellow]gap unknown[/]: cannot read coverage from Postgres ({e})")
        return None


@app.command()
def lag(
    data_dir: DataDir = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh a live table.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
    max_lag: Annotated[
        int | None, typer.Option("--max-lag", help="Exit 1 if any lag exceeds this.")
    ] = None,
    max_gap: Annotated[
        int | None,
        typer.Option("--max-gap", help="Exit 1 if any known gap exceeds this (0: any)."),
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.")] = 2.0,
) -> None:
    """Consumer lag per processor group and partition (committed, end, lag, gap, since
    commit). The gap counts records below the committed offset the projection never applied
    (a skipped range, which lag alone would read as 0). Rows ``relay:journal`` and
    ``relay:memory`` count what the relays have not published yet (acknowledged, so no
    processor's lag counts it): caught up means every row at lag 0."""
    from memstream.streams.lag import LagRow, LagWatcher, consumer_lag, processor_groups
    from memstream.streams.lag import max_gap as widest
    from memstream.streams.lag import max_lag as biggest

    bootstrap, _ = _bootstrap(data_dir)
    s = settings_for_running(data_dir)
    groups = processor_groups(s, PROCESSOR_TOPICS)
    dsn = s.postgres_dsn.get_secret_value()

    async def load() -> dict[PartitionKey, Ranges] | None:
        # read after the committed offsets (consumer_lag calls it so): no false gap from a
        # processor committing between the two reads
        return await _coverage(dsn, list(groups))

    topics = Topics(s.topic_prefix)
    names = list(groups)

    if not watch:

        async def once() -> tuple[list[LagRow], list[dict[str, object]], list[dict[str, object]]]:
            rows = await consumer_lag(bootstrap, groups, load_coverage=load)
            consumers, relays = await _lag_rows(data_dir, list(rows), names, dsn, topics)
            return rows, consumers, relays

        got = run(once())
        assert isinstance(got, tuple)
        rows, consumers, relays = got
        shown = consumers + relays
        if as_json:
            print(orjson.dumps(shown).decode())
        else:
            _print_full(_lag_table(shown))
        # a relay's backlog counts as lag (its gap is 0: it skips nothing)
        lag_now = max([biggest(rows), *(v for r in relays if isinstance(v := r["lag"], int))])
        if max_lag is not None and lag_now > max_lag:
            err.print(f"lag {lag_now} exceeds --max-lag {max_lag}")
            raise typer.Exit(1)
        if max_gap is not None and widest(rows) > max_gap:
            err.print(f"gap {widest(rows)} exceeds --max-gap {max_gap}")
            raise typer.Exit(1)
        return

    async def loop() -> None:
        watcher = LagWatcher(bootstrap, groups)
        with Live(console=out, refresh_per_second=4) as live:
            while True:
                rows = await watcher.poll(load_coverage=load)
                consumers, relays = await _lag_rows(data_dir, list(rows), names, dsn, topics)
                shown = consumers + relays
                if as_json:
                    print(orjson.dumps({"ts": time.time(), "rows": shown}).decode())
                else:
                    live.update(_lag_table(shown))
                await asyncio.sleep(interval)

    with contextlib.suppress(KeyboardInterrupt):
        run(loop())


@dlq_app.command("list")
def dlq_list(
    data_dir: DataDir = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    processor: Annotated[str | None, typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The most recent dead letters, oldest first."""
    from memstream.streams.dlq import list_dead_letters

    bootstrap, topics = _bootstrap(data_dir)
    letters = run(list_dead_letters(bootstrap, topics, limit, processor=processor))
    assert isinstance(letters, list)
    if as_json:
        print(orjson.dumps(letters).decode())  # dataclasses serialise natively
        return
    cells = [
        [d.id, d.processor, f"{d.origin_topic}/{d.origin_partition}@{d.origin_offset}", d.error]
        for d in letters
    ]
    title = f"{len(letters)} dead letter(s)"
    _print_full(_full_table(title, ["id", "processor", "origin", "error"], cells, fold="error"))


@dlq_app.command("retry")
def dlq_retry(
    ids: Annotated[list[str] | None, typer.Argument(help="Dead-letter ids (default: all).")] = None,
    data_dir: DataDir = None,
    processor: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Re-publish dead letters to their origin topics with their original keys."""
    from memstream.streams.dlq import retry_dead_letters

    bootstrap, topics = _bootstrap(data_dir)
    report = run(retry_dead_letters(bootstrap, topics, ids or None, processor=processor))
    out.print(
        f"republished {len(report.republished)}, skipped {len(report.skipped_lossy)} lossy, "  # type: ignore[attr-defined]
        f"{len(report.missing)} not found"  # type: ignore[attr-defined]
    )
    if report.missing or report.skipped_lossy:  # type: ignore[attr-defined]
        raise typer.Exit(1)


@app.command()
def hygiene(
    data_dir: DataDir = None,
    now: Annotated[bool, typer.Option("--now", help="Run one pass now (required).")] = False,
) -> None:
    """Memory hygiene: expire observations past 30 days and entries past their expiry, and
    decay importance (-0.1, floor 0.1) of project facts and observations not recalled in 90
    days. `memstream up` and workers run it daily; `--now` runs one pass immediately."""
    from memstream.clock import SystemClock
    from memstream.infra.cli.pipeline import hygiene_once
    from memstream.infra.postgres import create_pool

    if not now:
        err.print(
            "pass --now to run a hygiene pass now (the daily pass runs inside memstream up/worker)"
        )
        raise typer.Exit(2)
    dsn = postgres_dsn_or_exit(data_dir)

    async def go() -> object:
        pool = await create_pool(dsn)
        try:
            return await hygiene_once(pool, SystemClock())
        finally:
            await pool.close()

    report = run(go())
    if report is None:
        err.print("another hygiene pass is running; try again later")
        raise typer.Exit(1)
    out.print(f"hygiene: {report.expired} expired, {report.decayed} decayed")  # type: ignore[attr-defined]


@app.command()
def mcp(
    agent: Annotated[str, typer.Option(help="Agent whose memory it exposes.")],
    key: Annotated[
        str,
        typer.Option(envvar="MEMSTREAM_API_KEY", help="The account's API key (bearer)."),
    ],
    user: Annotated[str | None, typer.Option(help="End user the tools act for, if any.")] = None,
    url: Annotated[str | None, typer.Option(help="API URL (default: from --data-dir).")] = None,
    data_dir: DataDir = None,
) -> None:
    """The MCP tools over stdio, bridged to a running memstream: exactly memory_store,
    memory_recall and memory_forget (never the journal tools), each one the same call as
    over HTTP. Without --user, private stores become shared, as the spec says. MCP over
    HTTP is served by the API itself at /v1/agents/{agent_id}/mcp."""
    from memstream.agents_ctx.mcp_bridge import run_stdio_bridge
    from memstream.infra.cli.main import api_url_of

    base = api_url_of(settings_for_running(data_dir), url)
    run(run_stdio_bridge(base, key, agent, user))
