"""The port both ClickHouse adapters implement: three calls, no SQL of their own.

The SQL lives in :mod:`memstream.projections.messages.sql`; an engine only runs it. An
engine translates its driver's errors into :class:`~memstream.errors.RetryableInfraError`
(transient: the caller may retry the same batch) or
:class:`~memstream.errors.PermanentInfraError`.
"""

from __future__ import annotations

from collections.abc import Mapping
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

    async def insert_arrow(self, database: str, table: str, data: pa.Table) -> int:
        """Insert an Arrow table; returns once the insert is committed (durable on return).
        Returns the number of rows written."""
        ...

    async def close(self) -> None: ...
