"""The ``memstream`` command line (typer). Settings come from ``MEMSTREAM_*`` variables
and flags; commands that talk to a running system find it with ``--data-dir`` (the state
file ``memstream up`` writes) or with the ``MEMSTREAM_*`` addresses.

Exit status: 0 success, 1 the command ran but something failed (e.g. bad lines in
``produce``, lag over ``--max-lag``), 2 bad usage or configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar, cast

import typer
from rich.console import Console

from memstream.errors import MemstreamError
from memstream.infra.cli.state import read_state
from memstream.infra.log_queue import write_off_loop, writing_handlers
from memstream.infra.logs import formatter
from memstream.infra.settings import Settings

if TYPE_CHECKING:
    from memstream.infra.accounts import Accounts

T = TypeVar("T")

log = logging.getLogger("memstream.cli")

app = typer.Typer(
    name="memstream",
    help="Memory for LLM agents, as an event-sourced stream-processing pipeline.",
    no_args_is_help=True,
    add_completion=False,
)
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

err = Console(stderr=True)
out = Console()

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Data directory (default: $MEMSTREAM_DATA_DIR or .memstream)."),
]


def load_settings(data_dir: Path | None = None, **overrides: object) -> Settings:
    try:
        s = Settings()
    except Exception as e:  # pydantic ValidationError names the variable
        err.print(f"[red]invalid settings:[/] {e}")
        raise typer.Exit(2) from None
    update = {k: v for k, v in overrides.items() if v is not None}
    if data_dir is not None:
        update["data_dir"] = data_dir
    return s.model_copy(update=update) if update else s


def settings_for_running(data_dir: Path | None) -> Settings:
    """Settings of a running ``memstream up`` (its state file), else from the environment."""
    s = load_settings(data_dir)
    state = read_state(s.resolved_data_dir())
    if not state:
        return s
    from pydantic import SecretStr

    update: dict[str, object] = {}
    if not s.kafka_bootstrap and isinstance(state.get("kafka_bootstrap"), str):
        update["kafka_bootstrap"] = state["kafka_bootstrap"]
    for name in ("postgres_dsn", "redis_url", "admin_token"):
        cur = getattr(s, name).get_secret_value()
        if not cur and isinstance(state.get(name), str):
            update[name] = SecretStr(str(state[name]))
    return s.model_copy(update=update)


def postgres_dsn_or_exit(data_dir: Path | None) -> str:
    """The Postgres DSN from settings or the running system's state file, else exit 2."""
    dsn = settings_for_running(data_dir).postgres_dsn.get_secret_value()
    if not dsn:
        err.print(
            "[red]set MEMSTREAM_POSTGRES_DSN[/] (or pass --data-dir of a running `memstream up`)"
        )
        raise typer.Exit(2)
    return dsn


def api_url_of(s: Settings, url: str | None) -> str:
    if url:
        return url.rstrip("/")
    state = read_state(s.resolved_data_dir()) or {}
    found = state.get("api_url")
    if not isinstance(found, str) or not state.get("running"):
        err.print(
            f"[red]no running memstream found in {s.resolved_data_dir()}[/] "
            "(start one with `memstream up`, or pass --url)"
        )
        raise typer.Exit(2)
    return found


class _TransientKafkaNoise(logging.Filter):
    """aiokafka logs ERROR while a fresh broker creates its offsets topic
    (GroupCoordinatorNotAvailable) and retries by itself; that is start-up, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "GroupCoordinatorNotAvailable" not in record.getMessage()


LogFormatOpt = Annotated[
    str, typer.Option("--log-format", help="text, or json: one object per line (request ids...)")
]
AccessLogOpt = Annotated[
    bool, typer.Option("--access-log/--no-access-log", help="one INFO line per HTTP request")
]


def setup_logging(verbose: bool, log_format: str = "text", access_log: bool = False) -> None:
    """Root logging: WARNING (INFO with ``-v``), ``text`` or ``json`` lines (``infra.logs``:
    request ids, topic/partition/offset on event lines); the access log at INFO if asked.
    Lines are formatted and written by a thread (``infra.log_queue``), flushed at exit."""
    if log_format not in ("text", "json"):
        raise typer.BadParameter("--log-format must be text or json")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    # Our formats print neither thread nor process: a record need not look them up (the
    # access log makes one per request; 2.5 -> 1.7 µs a record).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    if sys.version_info >= (3, 12):
        logging.logAsyncioTasks = False
    root = logging.getLogger()
    for handler in writing_handlers(root):
        handler.setFormatter(formatter("json" if log_format == "json" else "text"))
        handler.addFilter(_TransientKafkaNoise())
    # formatting and writing on a thread of their own, not on the event loop
    write_off_loop(root)
    if access_log:
        logging.getLogger("memstream.access").setLevel(logging.INFO)


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop the serving commands run on: ``uvloop`` when asked or, for ``auto``, when it
    is installed (the ``server`` extra); None (asyncio's own) for ``asyncio`` or without it."""
    if choice == "asyncio":
        return None
    try:  # by name: mypy and the client-only install need not have it
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            err.print("[red]MEMSTREAM_EVENT_LOOP=uvloop but uvloop is not installed[/]")
            raise typer.Exit(2) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(coro: object, loop: str = "asyncio", switch_interval_s: float | None = None) -> object:
    """Run ``coro`` to its end; a ``MemstreamError`` exits 1 with its message. ``loop`` and
    ``switch_interval_s``: the ``event_loop`` and ``switch_interval_s`` settings, for the
    serving commands (``up``, ``api``, ``worker``)."""
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory(loop)) as runner:
            return runner.run(coro)  # type: ignore[arg-type]
    except MemstreamError as e:
        err.print(f"[red]error:[/] {e.message}" + (f" (field: {e.field})" if e.field else ""))
        raise typer.Exit(1) from None
    except Exception as e:
        message = unreachable(e)
        if message is None:
            raise
        err.print(f"[red]error:[/] {message}")
        raise typer.Exit(1) from None


def unreachable(e: BaseException) -> str | None:
    """A one-line message for a server that cannot be reached (the API over HTTP), or None
    for anything else (a bug keeps its traceback). The module is looked up, not imported:
    an error of it means it was loaded."""
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(e, httpx.TransportError):
        try:
            where = f" at {e.request.url.scheme}://{e.request.url.netloc.decode()}"
        except RuntimeError:  # no request attached
            where = ""
        detail = str(e) or type(e).__name__
        return (
            f"cannot reach the memstream API{where}: {detail} "
            "(is it running? pass --url, or the --data-dir of a running memstream up)"
        )
    return None


#: a stop that takes longer than this prints every thread's stack to stderr (then goes on)
STOP_STACK_DUMP_S = 30.0
#: once every part has stopped, the process exits within this even if a worker thread
#: (a native call in an executor: chdb, qdrant-edge, the embedder) never returns
EXIT_GRACE_S = 15.0


def _exit_if_stuck(grace_s: float) -> None:
    """Every part has stopped and closed its store: if the interpreter is still here
    ``grace_s`` later (it joins executor threads at exit, without a bound), name the
    threads that hold it and exit anyway."""

    def watch() -> None:
        time.sleep(grace_s)
        alive = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon]
        log.error("exiting %.0f s after stopping; threads still running: %s", grace_s, alive)
        faulthandler.dump_traceback(all_threads=True)
        # the root's handlers first: the one in front of the log thread writes its queue
        # (uvicorn's dictConfig took it off the list logging.shutdown flushes)
        for handler in logging.getLogger().handlers:
            handler.flush()
        logging.shutdown()
        os._exit(0)

    threading.Thread(target=watch, name="exit-watchdog", daemon=True).start()


async def serve_until_signal(stack_start: object, on_ready: object = None) -> None:
    """Start a Stack, print readiness, and stop it cleanly on SIGINT/SIGTERM.

    ``kill -USR1`` prints every thread's stack to stderr (a hung process tells where it
    hangs), ``kill -USR2`` every asyncio task with what it awaits (a processor stuck in a
    batch, :mod:`memstream.infra.task_dump`); a process still alive ``STOP_STACK_DUMP_S``
    after the stop began prints the threads' by itself."""
    from memstream.infra.cli.wiring import Stack
    from memstream.infra.task_dump import dump_tasks

    assert isinstance(stack_start, Stack)
    stack = stack_start
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    loop.add_signal_handler(signal.SIGUSR2, dump_tasks)
    try:
        await stack.start()
        if callable(on_ready):
            on_ready(stack)
        await stop.wait()
    finally:
        # not cancelled: a process still alive this long after the signal (a part that will
        # not stop, an executor thread the interpreter waits for at exit) says where it is
        faulthandler.dump_traceback_later(STOP_STACK_DUMP_S, exit=False)
        await stack.stop()
        _exit_if_stuck(EXIT_GRACE_S)


@app.command()
def up(
    data_dir: DataDir = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8080; 0 = any).")] = None,
    host: Annotated[str | None, typer.Option(help="HTTP host.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    log_format: LogFormatOpt = "text",
    access_log: AccessLogOpt = True,
) -> None:
    """Run everything on embedded servers: Postgres, Valkey and a Kafka broker as child
    processes, plus the API, the journal writer, the relays and every processor."""
    from memstream.infra.cli.wiring import Stack

    setup_logging(verbose, log_format, access_log)
    s = load_settings(data_dir, port=port, host=host)
    stack = Stack(s, embedded=True)

    def ready(st: Stack) -> None:
        st.record_state()
        print(f"memstream ready at {st.api_url}", flush=True)

    # the stack marks memstream.json not running
    run(serve_until_signal(stack, ready), s.event_loop, s.switch_interval_s)


@app.command()
def api(
    data_dir: DataDir = None,
    port: Annotated[int | None, typer.Option()] = None,
    host: Annotated[str | None, typer.Option()] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    log_format: LogFormatOpt = "text",
    access_log: AccessLogOpt = True,
) -> None:
    """Serve the HTTP API (and the journal writer and relay) against configured servers."""
    from memstream.infra.cli.wiring import Stack

    setup_logging(verbose, log_format, access_log)
    s = load_settings(data_dir, port=port, host=host)
    stack = Stack(s, embedded=False, api=True, pipeline=True, processors=[])

    def ready(st: Stack) -> None:
        print(f"memstream api ready at {st.api_url}", flush=True)

    run(serve_until_signal(stack, ready), s.event_loop, s.switch_interval_s)


@app.command()
def worker(
    processors: Annotated[
        list[str] | None, typer.Argument(help="Processors to run (default: all).")
    ] = None,
    data_dir: DataDir = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    log_format: LogFormatOpt = "text",
) -> None:
    """Run stream processors against configured servers; scale out by partitions."""
    from memstream.infra.cli.wiring import Stack

    setup_logging(verbose, log_format)
    s = load_settings(data_dir)
    stack = Stack(s, embedded=False, api=False, pipeline=False, processors=processors or None)

    def ready(_: Stack) -> None:
        print("memstream worker ready", flush=True)

    run(serve_until_signal(stack, ready), s.event_loop, s.switch_interval_s)


@app.command()
def migrate(data_dir: DataDir = None) -> None:
    """Apply Postgres migrations."""
    from memstream.infra.postgres import create_pool
    from memstream.infra.postgres import migrate as do_migrate

    dsn = postgres_dsn_or_exit(data_dir)

    async def go() -> list[str]:
        pool = await create_pool(dsn)
        try:
            return await do_migrate(pool)
        finally:
            await pool.close()

    applied = run(go())
    assert isinstance(applied, list)
    out.print(
        f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else "")
    )


def with_accounts(data_dir: Path | None, call: Callable[[Accounts], Awaitable[T]]) -> T:
    """``call`` on the account store of the configured Postgres (migrated first), run to its
    end: what every ``memstream keys`` command does."""
    from memstream.infra.accounts import Accounts
    from memstream.infra.postgres import create_pool
    from memstream.infra.postgres import migrate as do_migrate

    dsn = postgres_dsn_or_exit(data_dir)

    async def go() -> T:
        pool = await create_pool(dsn)
        try:
            await do_migrate(pool)
            return await call(Accounts(pool))
        finally:
            await pool.close()

    return cast(T, run(go()))


@keys_app.command("create")
def keys_create(
    account: str,
    data_dir: DataDir = None,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="May act across the account's users: browse, edit, export, import, erase.",
        ),
    ] = False,
) -> None:
    """Create an API key for ACCOUNT and print it (it is shown only this once)."""
    from memstream.agents_ctx.validation import check_id

    try:
        check_id(account, "ACCOUNT")
    except MemstreamError as e:
        err.print(f"[red]error:[/] {e.message}")
        raise typer.Exit(2) from None
    print(with_accounts(data_dir, lambda accounts: accounts.create_key(account, admin=admin)))


@keys_app.command("list")
def keys_list(account: str, data_dir: DataDir = None) -> None:
    """List ACCOUNT's API keys: their first characters, admin or not, created, revoked."""
    from rich.table import Table

    keys = with_accounts(data_dir, lambda accounts: accounts.list_keys(account))
    if not keys:
        err.print(f"[red]error:[/] no keys for account {account!r}")
        raise typer.Exit(1)
    table = Table("key", "admin", "created", "revoked")
    for k in keys:
        revoked = k.revoked_at.isoformat(timespec="seconds") if k.revoked_at else "-"
        table.add_row(
            k.prefix + "…",
            "yes" if k.admin else "no",
            k.created_at.isoformat(timespec="seconds"),
            revoked,
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key to revoke, or - to read it from stdin.")],
    data_dir: DataDir = None,
) -> None:
    """Revoke an API key (a leaked one): every API process refuses it within 5 s."""
    value = sys.stdin.readline().strip() if key == "-" else key.strip()
    if not value:
        err.print("[red]error:[/] KEY is empty")
        raise typer.Exit(2)

    async def revoke(accounts: Accounts) -> tuple[str | None, bool]:
        account = await accounts.revoke_key(value)
        if account is not None:
            return account, True
        return await accounts.key_revoked(value), False

    account, now = with_accounts(data_dir, revoke)
    if account is None:
        err.print("[red]error:[/] no such key")
        raise typer.Exit(1)
    if not now:  # a re-run: the key is revoked, as asked
        out.print(f"a key of {account} ({value[:8]}…) was revoked already")
        return
    out.print(f"revoked a key of {account} ({value[:8]}…); API processes refuse it within 5 s")


@keys_app.command("user-token")
def keys_user_token(
    account: str,
    user: str,
    ttl: Annotated[
        int, typer.Option(min=1, max=30 * 24 * 3600, help="Seconds the token is valid.")
    ] = 3600,
    data_dir: DataDir = None,
) -> None:
    """Mint a signed token that acts for USER of ACCOUNT only (send it as
    X-Memstream-User-Token with the account key, or alone as the bearer) and print it."""
    from memstream.agents_ctx import user_tokens
    from memstream.agents_ctx.validation import check_id

    try:
        check_id(account, "ACCOUNT")
        check_id(user, "USER")
    except MemstreamError as e:
        err.print(f"[red]error:[/] {e.message}")
        raise typer.Exit(2) from None

    async def mint(accounts: Accounts) -> str | None:
        secret = await accounts.user_token_secret(account, create=True)
        return None if secret is None else user_tokens.mint(secret, account, user, ttl)

    token = with_accounts(data_dir, mint)
    if token is None:
        err.print(f"[red]error:[/] no account {account!r} (create it with `memstream keys create`)")
        raise typer.Exit(1)
    print(token)


@keys_app.command("require-user-tokens")
def keys_require_user_tokens(
    account: str,
    off: Annotated[bool, typer.Option("--off", help="Accept X-Memstream-User again.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Make ACCOUNT's agent routes require a signed user token: X-Memstream-User alone, and
    calls without a user, are refused with 401 (admin keys are exempt)."""
    if not with_accounts(
        data_dir, lambda accounts: accounts.set_require_user_tokens(account, not off)
    ):
        err.print(f"[red]error:[/] no account {account!r}")
        raise typer.Exit(1)
    out.print(f"{account}: user tokens {'optional' if off else 'required'}")


@app.command()
def produce(
    file: Annotated[str, typer.Argument(help="JSON-lines file of messages, or - for stdin.")],
    data_dir: DataDir = None,
    url: Annotated[str | None, typer.Option(help="API URL (default: the running `up`).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=64)] = 8,
) -> None:
    """Append JSON lines of messages to the journal, with a progress bar and a per-line
    error report. Exits 1 if any line failed."""
    from memstream.infra.cli.produce_cmd import produce_file

    s = settings_for_running(data_dir)
    base = api_url_of(s, url)
    token = s.admin_token.get_secret_value()
    if not token:
        err.print(
            "[red]no admin token[/]: set MEMSTREAM_ADMIN_TOKEN or use --data-dir of `memstream up`"
        )
        raise typer.Exit(2)
    ok = run(produce_file(file, base, token, concurrency, err))
    if not ok:
        raise typer.Exit(1)


def main() -> None:
    from memstream.infra.cli import (
        memory_cmd,  # noqa: F401 - registers memory and erase
        ops,  # noqa: F401 - registers lag and dlq commands
        replay_cmd,  # noqa: F401 - registers replay
    )

    with contextlib.suppress(BrokenPipeError):
        app()


if __name__ == "__main__":
    # Run through the package entry point so commands registered by other modules (ops,
    # replay) attach to the imported module's ``app``, not to this __main__ copy.
    from memstream.infra.cli.main import main as _main

    _main()
