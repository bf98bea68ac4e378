"""``memstream memory list|get|edit|export|import`` and ``memstream erase thread|user``:
owning memory from the command line, through the HTTP API of a running system (the same
routes and rules as ``MemstreamClient``; docs/owning-memory.md).

Every command takes ``--key`` (or ``$MEMSTREAM_API_KEY``: an API key, ``--admin`` for
other users' entries and user erasure), ``--url`` (default: the running ``memstream up``
found through ``--data-dir``) and ``--user`` (``X-Memstream-User``).

Exit status: 0 success; 1 the API refused (the error and its field are printed), an import
had failed lines, or an erasure did not finish; 2 bad usage.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from memstream.client import MemstreamClient
from memstream.infra.cli.main import DataDir, api_url_of, app, err, out, run, settings_for_running

memory_app = typer.Typer(help="Browse, edit, export and import agent memory.", no_args_is_help=True)
erase_app = typer.Typer(help="Erase a thread or a user everywhere.", no_args_is_help=True)
app.add_typer(memory_app, name="memory")
app.add_typer(erase_app, name="erase")

Key = Annotated[str, typer.Option("--key", envvar="MEMSTREAM_API_KEY", help="API key.")]
Url = Annotated[str | None, typer.Option("--url", help="API URL (default: the running `up`).")]
User = Annotated[str | None, typer.Option("--user", help="End user (X-Memstream-User).")]
Agent = Annotated[str, typer.Argument(help="Agent id.")]
UserFilter = Annotated[
    str | None, typer.Option("--user-id", help="Another user's entries (admin key).")
]


def _client(url: str | None, data_dir: Path | None, key: str, user: str | None) -> MemstreamClient:
    base = api_url_of(settings_for_running(data_dir), url)
    return MemstreamClient(base, key, user=user, timeout=120.0)


def _print_json(doc: object) -> None:
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")


@memory_app.command("list")
def memory_list(
    agent: Agent,
    key: Key,
    url: Url = None,
    user: User = None,
    user_id: UserFilter = None,
    category: Annotated[str | None, typer.Option()] = None,
    visibility: Annotated[str | None, typer.Option()] = None,
    q: Annotated[str | None, typer.Option("--q", help="Substring of key or content.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200)] = 50,
    cursor: Annotated[str | None, typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    data_dir: DataDir = None,
) -> None:
    """One page of entries, newest first (prints the next cursor, if any)."""

    async def go() -> dict[str, object]:
        async with _client(url, data_dir, key, user) as c:
            return await c.memory_entries(
                agent,
                category=category,
                visibility=visibility,
                user_id=user_id,
                q=q,
                limit=limit,
                cursor=cursor,
            )

    page = run(go())
    assert isinstance(page, dict)
    if as_json:
        _print_json(page)
        return
    table = Table("key", "category", "visibility", "user", "importance", "created", "content")
    for e in page["entries"]:
        content = str(e["content"])
        table.add_row(
            str(e["key"]),
            str(e["category"]),
            str(e["visibility"]),
            str(e["user_id"] or ""),
            f"{e['importance']:.2f}",
            str(e["created_at"]),
            content if len(content) <= 60 else content[:57] + "...",
        )
    out.print(table)
    if page["next_cursor"]:
        out.print(f"next page: --cursor {page['next_cursor']}")


@memory_app.command("get")
def memory_get(
    agent: Agent,
    entry_key: Annotated[str, typer.Argument(metavar="KEY", help="The entry's key.")],
    key: Key,
    url: Url = None,
    user: User = None,
    user_id: UserFilter = None,
    data_dir: DataDir = None,
) -> None:
    """One entry, as JSON."""

    async def go() -> dict[str, object]:
        async with _client(url, data_dir, key, user) as c:
            return await c.memory_entry(agent, entry_key, user_id=user_id)

    _print_json(run(go()))


@memory_app.command("edit")
def memory_edit(
    agent: Agent,
    entry_key: Annotated[str, typer.Argument(metavar="KEY", help="The entry's key.")],
    key: Key,
    content: Annotated[str | None, typer.Option()] = None,
    importance: Annotated[float | None, typer.Option()] = None,
    category: Annotated[str | None, typer.Option()] = None,
    expires_at: Annotated[str | None, typer.Option(help="ISO-8601 time, or 'never'.")] = None,
    url: Url = None,
    user: User = None,
    user_id: UserFilter = None,
    data_dir: DataDir = None,
) -> None:
    """Edit an entry through every store rule; prints the status and the entry."""
    changes: dict[str, object] = {}
    for name, value in (("content", content), ("importance", importance), ("category", category)):
        if value is not None:
            changes[name] = value
    if expires_at is not None:
        changes["expires_at"] = None if expires_at == "never" else expires_at
    if not changes:
        err.print(
            "[red]nothing to change[/]: pass --content, --importance, --category or --expires-at"
        )
        raise typer.Exit(2)

    async def go() -> dict[str, object]:
        async with _client(url, data_dir, key, user) as c:
            return await c.memory_edit(agent, entry_key, changes, user_id=user_id)

    _print_json(run(go()))


@memory_app.command("export")
def memory_export(
    agent: Agent,
    key: Key,
    output: Annotated[str, typer.Option("--output", "-o", help="File, or - for stdout.")] = "-",
    url: Url = None,
    user: User = None,
    user_id: UserFilter = None,
    category: Annotated[str | None, typer.Option()] = None,
    data_dir: DataDir = None,
) -> None:
    """Every entry as NDJSON (one entry per line), streamed."""

    async def go() -> int:
        n = 0
        sink = sys.stdout.buffer if output == "-" else open(output, "wb")  # noqa: SIM115
        try:
            async with _client(url, data_dir, key, user) as c:
                async for entry in c.memory_export(agent, category=category, user_id=user_id):
                    sink.write(orjson.dumps(entry) + b"\n")
                    n += 1
        finally:
            if sink is not sys.stdout.buffer:
                sink.close()
        return n

    n = run(go())
    err.print(f"exported {n} entr{'y' if n == 1 else 'ies'}")


@memory_app.command("import")
def memory_import(
    agent: Agent,
    file: Annotated[str, typer.Argument(help="NDJSON file of exported entries, or - for stdin.")],
    key: Key,
    url: Url = None,
    user: User = None,
    data_dir: DataDir = None,
) -> None:
    """Import exported entries (idempotent by key and content hash); reports failed lines
    and exits 1 if there were any."""
    try:
        body = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as unreadable:
        err.print(f"[red]cannot read {file}:[/] {unreadable.strerror or unreadable}")
        raise typer.Exit(1) from None

    async def go() -> dict[str, object]:
        async with _client(url, data_dir, key, user) as c:
            return await c.memory_import(agent, body)

    report = run(go())
    assert isinstance(report, dict)
    out.print(
        f"created {report['created']}, replaced {report['replaced']}, "
        f"unchanged {report['unchanged']}, failed {len(report['failed'])}"
    )
    for f in report["failed"]:
        e = f["error"]
        where = f" (field: {e['field']})" if e.get("field") else ""
        err.print(f"  line {f['line']}: {e['code']}{where}: {e['message']}")
    if report["failed"]:
        raise typer.Exit(1)


async def _follow(c: MemstreamClient, erasure_id: str, timeout_s: float) -> dict[str, object]:
    """Poll the erasure, showing what each store removed so far, until done (or timeout)."""
    deadline = time.monotonic() + timeout_s
    with err.status(f"erasing ({erasure_id})") as status:
        while True:
            doc = await c.erasure(erasure_id)
            stores = doc.get("stores") or {}
            assert isinstance(stores, dict)
            step = doc.get("step")
            status.update(
                f"erasing ({erasure_id})"
                + (f" [{step}]" if step else "")
                + ": "
                + ", ".join(f"{k} {v}" for k, v in sorted(stores.items()) if v)
            )
            if doc["status"] == "done" or time.monotonic() > deadline:
                return doc
            await asyncio.sleep(0.5)


def _report(doc: object) -> None:
    assert isinstance(doc, dict)
    table = Table("store", "removed")
    stores = doc.get("stores") or {}
    assert isinstance(stores, dict)
    for name, count in sorted(stores.items()):
        table.add_row(str(name), str(count))
    out.print(table)
    stopped = f" (at: {doc['step']})" if doc.get("step") and doc["status"] != "done" else ""
    out.print(f"erasure {doc['erasure_id']}: {doc['status']}{stopped}")
    if doc["status"] != "done":
        raise typer.Exit(1)


Wait = Annotated[float, typer.Option("--timeout", help="Seconds to wait for done.")]


@erase_app.command("thread")
def erase_thread(
    agent: Agent,
    thread: Annotated[str, typer.Argument(help="Thread id.")],
    key: Key,
    url: Url = None,
    user: User = None,
    timeout: Wait = 600.0,
    data_dir: DataDir = None,
) -> None:
    """Erase a thread everywhere (journal, summaries, Redis, ClickHouse...), with progress
    and a report of what each store removed."""

    async def go() -> object:
        async with _client(url, data_dir, key, user) as c:
            erasure_id = await c.erase_thread(agent, thread)
            return await _follow(c, erasure_id, timeout)

    _report(run(go()))


@erase_app.command("user")
def erase_user(
    user_id: Annotated[str, typer.Argument(help="The user to erase.")],
    key: Key,
    url: Url = None,
    timeout: Wait = 3600.0,
    data_dir: DataDir = None,
) -> None:
    """Erase a user in every agent of the account (admin key): entries, threads and
    everything derived from them, with progress and a report."""

    async def go() -> object:
        async with _client(url, data_dir, key, None) as c:
            erasure_id = await c.erase_user(user_id)
            return await _follow(c, erasure_id, timeout)

    _report(run(go()))
