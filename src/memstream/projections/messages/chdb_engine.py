"""The embedded ClickHouse adapter: chdb, in-process, one data directory per process.

chdb calls block, so each runs on one dedicated worker thread: off the event loop, and
serialized (a chdb connection accepts no other statement while a streaming insert is
open). Inserts go in as Arrow IPC (``send_insert(..., "ArrowStream")``), the fastest path
measured (~320k rows/s). An insert is committed when ``finish()`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pyarrow as pa

from memstream.errors import PermanentInfraError, RetryableInfraError
from memstream.projections.messages.engine import Row
from memstream.projections.messages.rows import arrow_ipc
from memstream.projections.messages.sql import SqlParam, bind_for_text, check_database

T = TypeVar("T")

# Errors that mean "the statement is wrong" rather than "try again".
_PERMANENT_MARKERS = ("SYNTAX_ERROR", "UNKNOWN_TABLE", "ILLEGAL", "BAD_ARGUMENTS", "TYPE_MISMATCH")


def _quote_literal(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ChdbEngine:
    """chdb at ``path`` (a directory; created if missing). ``":memory:"`` for throwaway use."""

    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        if self._path != ":memory:":
            Path(self._path).mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chdb")
        self._conn: Any = None
        self._input_path: str | None = None

    async def _run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn)
        except (PermanentInfraError, RetryableInfraError):
            raise
        except Exception as e:
            msg = str(e)
            if any(m in msg for m in _PERMANENT_MARKERS):
                raise PermanentInfraError(f"chdb: {msg}") from e
            raise RetryableInfraError(f"chdb: {msg}") from e

    def _connection(self) -> Any:
        if self._conn is None:
            import chdb  # lazy: chdb is in the [embedded] extra, not the core install

            self._conn = chdb.connect(self._path)  # type: ignore[no-untyped-call]
        return self._conn

    async def command(self, sql: str) -> None:
        await self._run(lambda: self._connection().query(sql, "CSV"))

    async def rows(self, sql: str, params: Mapping[str, SqlParam]) -> list[Row]:
        bound = bind_for_text(params)

        def go() -> list[Row]:
            res = self._connection().query(sql, "JSONCompact", params=bound)
            data = orjson.loads(res.bytes())["data"]
            return [tuple(r) for r in data]

        return await self._run(go)

    async def arrow(self, sql: str, params: Mapping[str, SqlParam]) -> pa.Table:
        bound = bind_for_text(params)

        def go() -> pa.Table:
            conn = self._connection()
            try:
                return conn.query(sql, "Arrowtable", params=bound)
            except Exception:
                with contextlib.suppress(Exception):  # see query_input_arrow
                    conn.query("SELECT 1", "CSV")
                raise

        return await self._run(go)

    async def insert_arrow(self, database: str, table: str, data: pa.Table) -> int:
        stmt = f"INSERT INTO {check_database(database)}.{check_database(table)}"

        def go() -> int:
            payload = arrow_ipc(data)  # on the worker too: the event loop stays free
            with self._connection().send_insert(stmt, "ArrowStream") as ins:
                ins.append(payload)
                res = ins.finish()
            return int(res.rows_written)

        return await self._run(go)

    async def query_input_arrow(
        self, sql_of_source: Callable[[str], str], payload: bytes, fmt: str, structure: str
    ) -> pa.Table:
        """The payload goes through a file (chdb's ``file()`` reads it with ClickHouse's own
        parser); one file per engine, reused, since this engine's calls are serialized."""

        def go() -> pa.Table:
            path = self._input_file()
            with open(path, "wb") as f:
                f.write(payload)
            source = f"file({_quote_literal(path)}, {fmt}, {_quote_literal(structure)})"
            conn = self._connection()
            try:
                return conn.query(sql_of_source(source), "Arrowtable")
            except Exception:
                # chdb 4.x: after a failed "Arrowtable" query, the next query on the
                # connection answers in Arrow whatever format it asked for. One
                # throwaway query resets it.
                with contextlib.suppress(Exception):
                    conn.query("SELECT 1", "CSV")
                raise

        return await self._run(go)

    def _input_file(self) -> str:
        if self._input_path is None:
            fd, self._input_path = tempfile.mkstemp(prefix="memstream-chdb-", suffix=".input")
            os.close(fd)
        return self._input_path

    async def close(self) -> None:
        def go() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._input_path is not None:
                Path(self._input_path).unlink(missing_ok=True)
                self._input_path = None

        await self._run(go)
        self._pool.shutdown(wait=True)
