"""The ClickHouse server adapter (clickhouse-connect). Thin on purpose: it runs exactly the
SQL the chdb adapter runs (:mod:`memstream.projections.messages.sql`).

Not exercised by the test suite: no ClickHouse server recent enough for ``text`` indexes
can run on the build machines (INFRA.md). It binds ``{name:Type}`` parameters server-side
and inserts Arrow tables with ``insert_arrow``; an insert is committed when it returns
(ClickHouse acknowledges a synchronous insert after writing the part).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from memstream.errors import RetryableInfraError
from memstream.projections.messages.engine import Row
from memstream.projections.messages.sql import SqlParam, check_database


class ClickHouseConnectEngine:
    """A ClickHouse server at ``url`` (``http(s)://user:password@host:port``)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: Any = None

    async def _get(self) -> Any:
        if self._client is None:
            import clickhouse_connect  # noqa: PLC0415 - only on the server path

            try:
                self._client = await clickhouse_connect.get_async_client(dsn=self._url)
            except Exception as e:
                raise RetryableInfraError(f"clickhouse: cannot connect: {e}") from e
        return self._client

    async def command(self, sql: str) -> None:
        client = await self._get()
        try:
            await client.command(sql)
        except Exception as e:
            raise RetryableInfraError(f"clickhouse: {e}") from e

    async def rows(self, sql: str, params: Mapping[str, SqlParam]) -> list[Row]:
        client = await self._get()
        try:
            res = await client.query(sql, parameters=dict(params))
        except Exception as e:
            raise RetryableInfraError(f"clickhouse: {e}") from e
        return [tuple(r) for r in res.result_rows]

    async def arrow(self, sql: str, params: Mapping[str, SqlParam]) -> pa.Table:
        client = await self._get()
        try:
            return await client.query_arrow(sql, parameters=dict(params))
        except Exception as e:
            raise RetryableInfraError(f"clickhouse: {e}") from e

    async def insert_arrow(self, database: str, table: str, data: pa.Table) -> int:
        client = await self._get()
        try:
            await client.insert_arrow(check_database(table), data, database=database)
        except Exception as e:
            raise RetryableInfraError(f"clickhouse: {e}") from e
        return int(data.num_rows)

    async def query_input_arrow(
        self, sql_of_source: Callable[[str], str], payload: bytes, fmt: str, structure: str
    ) -> pa.Table:
        """The payload travels with the query as an external table named ``journal_batch``."""
        from clickhouse_connect.driver.external import ExternalData  # noqa: PLC0415

        client = await self._get()
        data = ExternalData(file_name="journal_batch", data=payload, fmt=fmt, structure=structure)
        try:
            return await client.query_arrow(sql_of_source("journal_batch"), external_data=data)
        except Exception as e:
            raise RetryableInfraError(f"clickhouse: {e}") from e

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
