"""The port both ClickHouse adapters implement: a few calls, no SQL of their own.

The SQL lives in :mod:`memstream.projections.messages.sql`; an engine only runs it. An
engine translates its driver's errors into :class:`~memstream.errors.RetryableInfraError`
(transient: the caller may retry the same batch) or
:class:`~memstream.errors.PermanentInfraError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import pyarrow as pa

from memstream.projections.messages.sql import SqlParam

Row = tuple[object, ...]


class ClickHouseEngine(Protocol):
    async def command(self, sql: str) -> None:
        """Run a statement that returns nothing (DDL)."""
        ...

    async def rows(self, sql: str, params: Mapping[str, SqlParam]) -> list[Row]:
        """Run a query with bound ``{name:Type}`` parameters; all result rows."""
        ...

    async def arrow(self, sql: str, params: Mapping[str, SqlParam]) -> pa.Table:
        """:meth:`rows` as an Arrow table (bulk reads: no per-value decoding in Python)."""
        ...

    async def insert_arrow(self, database: str, table: str, data: pa.Table) -> int:
        """Insert an Arrow table; returns once the insert is committed (durable on return).
        Returns the number of rows written."""
        ...

    async def query_input_arrow(
        self, sql_of_source: Callable[[str], str], payload: bytes, fmt: str, structure: str
    ) -> pa.Table:
        """Run the query ``sql_of_source(source)`` where ``source`` is a table expression
        reading ``payload`` (rows in format ``fmt`` with columns ``structure``); the result
        as an Arrow table. The SQL is the same for every adapter; only ``source`` differs
        (a ``file(...)`` for chdb, an external table for a server)."""
        ...

    async def close(self) -> None: ...
