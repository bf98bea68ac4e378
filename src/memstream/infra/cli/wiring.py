"""The composition root: builds every adapter from ``Settings`` and runs them.

``Stack`` is everything one process runs. ``memstream up`` starts it with ``embedded=True``
(launching Postgres, Valkey and a Kafka broker as child processes under the data
directory, with chdb, qdrant-edge and SlateDB in-process); ``memstream api`` and
``memstream worker`` start parts of it against configured servers. Parts start in
dependency order and stop in reverse; a failure while starting stops what had started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import redis.asyncio as aioredis
import uvicorn
from pydantic import SecretStr

if TYPE_CHECKING:
    from memstream.infra.llm import FactExtractor
    from memstream.projections.memory_index.index import MemoryIndex
    from memstream.streams.journal_relay import JournalRelay
    from memstream.streams.runner import Runner

from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.services import Services
from memstream.clock import Clock, SystemClock
from memstream.infra.accounts import Accounts
from memstream.infra.cli.dir_lock import DataDirLock
from memstream.infra.cli.pipeline import build_adapters, start_pipeline
from memstream.infra.cli.state import clear_running, read_state, write_state
from memstream.infra.embedded.base import EmbeddedServer, port_is_free
from memstream.infra.embedded.kafka import TansuServer, embedded_broker
from memstream.infra.embedded.keeper import Keepers, RestartPolicy
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.journal import Journal, JournalReader, open_journal, open_journal_reader
from memstream.infra.metrics import make_metrics
from memstream.infra.postgres import close_pool, create_pool, migrate
from memstream.infra.settings import Settings

log = logging.getLogger(__name__)

Stopper = Callable[[], Awaitable[None]]

#: one part's stop may take this long before the stack gives up on it and stops the rest
#: (longer than any embedded server's SIGTERM grace, so a server is always SIGKILLed)
STOP_PART_TIMEOUT_S = 30.0
#: a part that takes longer than this to stop is logged, with the time
SLOW_STOP_S = 3.0
#: open HTTP connections get this long to finish when the server stops
HTTP_GRACEFUL_S = 5

TANSU_WARNING = (
    "WARNING: no Java 17+ and Maven found (or kafka_broker=tansu): memstream up runs the "
    "Tansu broker, which keeps everything in memory. Topics, consumer offsets and dead "
    "letters are lost whenever memstream or the broker restarts; the journal re-publishes "
    "every topic at start and the processors re-apply it (idempotent), but dead letters "
    "are gone for good, memory writes published and not yet indexed when it stops wait for "
    "`memstream replay memory`, and there is no idempotent producer. Install Java 17+ and "
    "Maven (or set MEMSTREAM_KAFKA_BOOTSTRAP) for a durable broker."
)


@dataclass
class Stack:
    """One process's parts. ``api``: serve HTTP; ``pipeline``: journal writer, relays and
    processors. ``memstream up`` runs both with embedded servers."""

    settings: Settings
    embedded: bool = False
    api: bool = True
    pipeline: bool = True
    processors: list[str] | None = None
    clock: Clock = field(default_factory=SystemClock)
    servers: list[EmbeddedServer] = field(default_factory=list)
    pool: asyncpg.Pool | None = None
    redis: aioredis.Redis | None = None
    journal: Journal | None = None
    journal_reader: JournalReader | None = None
    services: Services | None = None
    memory_index: MemoryIndex | None = None
    fact_extractor: FactExtractor | None = None
    journal_relay: JournalRelay | None = None
    runner: Runner | None = None
    api_url: str = ""
    _stoppers: list[Stopper] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    dir_lock: DataDirLock | None = None
    #: under ``memstream up``: restarts an embedded server that died (``embedded.keeper``)
    keepers: Keepers | None = None

    def on_stop(self, stopper: Stopper) -> None:
        """Run ``stopper`` when the stack stops (before what was started earlier)."""
        self._stoppers.append(stopper)

    # --- start ------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        data_dir = self.settings.resolved_data_dir()
        data_dir.mkdir(parents=True, exist_ok=True)
        if self.embedded or self.pipeline:  # before anything is launched or opened
            lock = DataDirLock(data_dir)
            lock.acquire()  # AlreadyRunning: nothing touched
            self.dir_lock = lock
            self._stoppers.append(self._release_lock)
        if self.embedded:
            await self._start_embedded(data_dir)
        s = self.settings
        self.pool = await create_pool(
            s.postgres_dsn.get_secret_value(),
            max_size=20,
            acquire_timeout_s=s.postgres_acquire_timeout_s,
        )
        pool = self.pool
        self._stoppers.append(lambda: close_pool(pool))
        await migrate(self.pool)
        accounts = Accounts(self.pool)
        for account, key in s.seeded_api_keys():
            await accounts.add_key(account, key)
        self.redis = aioredis.from_url(s.redis_url.get_secret_value())
        self._stoppers.append(self.redis.aclose)
        metrics = make_metrics()
        if self.pipeline:
            self.journal = await open_journal(s, self.clock, metrics)
            self._stoppers.append(self.journal.close)
        elif self.processors != []:
            self.journal_reader = await open_journal_reader(s)
            self._stoppers.append(self.journal_reader.close)
        self.services = Services(
            settings=s,
            accounts=accounts,
            journal=self.journal,
            clock=self.clock,
            metrics=metrics,
        )
        if s.seal_topics:  # crypto-shredding of the Kafka copies (infra/data_keys.py)
            from memstream.infra.data_keys import Keyring

            self.services.keyring = Keyring(self.pool, cache_s=s.data_key_cache_s)
        self._stoppers.extend(await build_adapters(self))
        if self.pipeline or self.processors != []:
            self._stoppers.extend(await start_pipeline(self))
        if self.journal is not None:  # erasure runs beside the journal's single writer
            from memstream.agents_ctx.erasure import Erasures

            erasures = Erasures(self.services, rewrite_tables=s.erasure_rewrite_tables)
            self.services.erasures = erasures
            self._stoppers.append(erasures.close)
            await erasures.resume()  # finish erasures a crash interrupted
        from memstream.infra.cli.health_wiring import wire_readiness

        uses_kafka = self.pipeline or self.processors != []
        readiness = wire_readiness(self, kafka=uses_kafka)
        readiness.interval_s = s.readiness_interval_s
        await readiness.start()
        self._stoppers.append(readiness.stop)
        if self.api:
            from memstream.infra.cli.console_ops import StackOperations

            self.services.operations = StackOperations(self)
            await self._start_api()

    async def _start_embedded(self, data_dir: Path) -> None:
        """Launch what the settings leave unset; reuse last run's ports when still free."""
        s = self.settings
        previous = read_state(data_dir) or {}
        ports = previous.get("ports") if isinstance(previous.get("ports"), dict) else {}
        assert isinstance(ports, dict)

        def port(name: str) -> int | None:
            p = ports.get(name)
            return p if isinstance(p, int) and port_is_free(p) else None

        update: dict[str, object] = {}
        if not s.postgres_dsn.get_secret_value():
            pg = EmbeddedPostgres(data_dir / "postgres", port=port("postgres"))
            await self._launch(pg)
            update["postgres_dsn"] = SecretStr(pg.dsn)
        if not s.redis_url.get_secret_value():
            rd = EmbeddedRedis(data_dir / "redis", port=port("redis"))
            await self._launch(rd)
            update["redis_url"] = SecretStr(rd.url)
        if not s.kafka_bootstrap:
            broker = embedded_broker(
                data_dir,
                broker=s.kafka_broker,
                port=port("kafka"),
                version=s.kafka_version,
                partitions=s.partitions,
            )
            if isinstance(broker, TansuServer):
                log.warning(TANSU_WARNING)
            await self._launch(broker)
            update["kafka_bootstrap"] = broker.address
        if not s.admin_token.get_secret_value():
            token = previous.get("admin_token")
            update["admin_token"] = SecretStr(
                token if isinstance(token, str) else secrets.token_urlsafe(24)
            )
        self.settings = s.model_copy(update=update)
        if s.server_restart_tries > 0 and self.servers:
            policy = RestartPolicy(
                max_tries=s.server_restart_tries, max_backoff_s=s.server_restart_max_backoff_s
            )
            keepers = Keepers(policy)
            for server in self.servers:
                hook = self._after_broker_restart if server.name in ("kafka", "tansu") else None
                keepers.watch(server, on_restart=hook)
            self.keepers = keepers
            self._stoppers.append(keepers.stop)  # stops watching before the servers stop

    async def _after_broker_restart(self) -> None:
        """A restarted broker: topics again (Tansu keeps none), and the journal relay
        re-checks the broker's log (re-publishing the journal if it was lost)."""
        from memstream.infra.kafka.admin import ensure_topics
        from memstream.schemas.topics import Topics

        s = self.settings
        await ensure_topics(
            s.kafka_bootstrap, Topics(s.topic_prefix), s.partitions, s.replication_factor
        )
        relay = self.journal_relay
        if relay is not None:
            await relay.stop()
            await relay.start()

    async def _launch(self, server: EmbeddedServer) -> None:
        await server.start()
        self.servers.append(server)
        self._stoppers.append(server.stop)

    async def _start_api(self) -> None:
        assert self.services is not None
        s = self.settings
        app = create_app(self.services)
        from memstream.agents_ctx.console import stop as stop_console

        self._stoppers.append(lambda: stop_console(app))  # its sampler and replays
        config = uvicorn.Config(
            app,
            host=s.host,
            port=s.port,
            http=http_protocol(),
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=HTTP_GRACEFUL_S,
        )
        server = uvicorn.Server(config)
        self._server = server
        # _serve, not serve: serve() swaps in uvicorn's own signal handlers, and the process
        # that hosts us (memstream up, tests) owns SIGINT/SIGTERM.
        task = asyncio.create_task(server._serve(), name="uvicorn")
        self._tasks.append(task)
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.02)
        sock = server.servers[0].sockets[0].getsockname()
        self.api_url = f"http://{s.host}:{sock[1]}"

    def record_state(self) -> None:
        """Write ``memstream.json`` for the other CLI commands."""
        import os

        s = self.settings
        ports: dict[str, int] = {}
        for srv in self.servers:
            ports[{"postgres": "postgres", "valkey": "redis"}.get(srv.name, "kafka")] = srv.port
        write_state(
            s.resolved_data_dir(),
            {
                "running": True,
                "pid": os.getpid(),
                "api_url": self.api_url,
                "kafka_bootstrap": s.kafka_bootstrap,
                "postgres_dsn": s.postgres_dsn.get_secret_value(),
                "redis_url": s.redis_url.get_secret_value(),
                "admin_token": s.admin_token.get_secret_value(),
                "topic_prefix": s.topic_prefix,
                "ports": ports,
            },
        )

    # --- stop -------------------------------------------------------------------------------
    async def _release_lock(self) -> None:
        """Last stopper: mark ``memstream.json`` not running while still holding the lock
        (a refused second process never gets here, so it touches nothing)."""
        if self.dir_lock is not None:
            if self.embedded:
                clear_running(self.settings.resolved_data_dir())
            self.dir_lock.release()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(t, 10)
        self._tasks.clear()
        while self._stoppers:
            stop = self._stoppers.pop()
            began = time.monotonic()
            try:
                await asyncio.wait_for(stop(), STOP_PART_TIMEOUT_S)
                took = time.monotonic() - began
                if took > SLOW_STOP_S:
                    log.warning("stopping %s took %.1f s", _name(stop), took)
            except TimeoutError:
                log.error(
                    "%s did not stop within %.0f s; going on", _name(stop), STOP_PART_TIMEOUT_S
                )
            except Exception:
                log.exception("error while stopping %s", _name(stop))


def http_protocol() -> type[asyncio.Protocol] | str:
    """httptools with one socket write per answer (``http_protocol``), or uvicorn's own
    choice when httptools (the ``server`` extra) is not installed."""
    try:
        from memstream.infra.cli.http_protocol import CoalescingHttpTools
    except ImportError:
        return "auto"
    return CoalescingHttpTools


def _name(stop: Stopper) -> str:
    """A stopper as a log line names it: ``EmbeddedPostgres.stop``, ``Runner.stop``..."""
    owner = getattr(stop, "__self__", None)
    name = getattr(stop, "__qualname__", None) or repr(stop)
    return f"{type(owner).__name__}.{stop.__name__}" if owner is not None else name
