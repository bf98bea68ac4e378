"""aiokafka's fetched records handed over as our :class:`RawRecord`, without its own record.

aiokafka decodes a fetched record batch in C, then builds one Python ``ConsumerRecord``
dataclass per record (eleven fields, a ``tuple`` of the headers) on the event loop, which
the consume loop turned into a :class:`RawRecord` at once (a second object, a second
function call). For the processors that was the largest share of the per-record cost left
in the runtime (``docs/streams.md``, "The record constructor" and "Fetched records").

A consumer built with ``value_deserializer=as_raw_record`` (and no key deserializer) gets,
from ``getmany``, :class:`RawRecord` objects built straight from aiokafka's C records: the
same fields ``consumer.raw_record`` gives (timestamp in epoch seconds, the
``memstream-retry-for`` header, ``b""`` for a missing value). Every other consumer in the
process is left as it was: the subclass falls back to aiokafka's own record for them.

:func:`install` puts the subclass in place of aiokafka's ``PartitionRecords`` (the name its
fetcher builds per fetched partition); it is idempotent, called by the consumer before it
starts one, and refuses to run over anyone else's replacement. The hook is aiokafka's
private API: ``aiokafka`` is pinned in ``constraints.txt``, ``<0.15`` in ``pyproject.toml``,
and ``tests/unit/test_fetched_records.py`` checks the hook is still where it was.
"""

from __future__ import annotations

from typing import Any, NoReturn

from aiokafka.consumer import fetcher as _fetcher

from memstream.streams.processor import RETRY_FOR_HEADER, new_raw_record

__all__ = ["as_raw_record", "install"]

_ORIGINAL: type = _fetcher.PartitionRecords


def as_raw_record(value: bytes | None) -> NoReturn:
    """The marker deserializer: a consumer built with it gets :class:`RawRecord` objects.
    Never called once :func:`install` ran; called, it means the hook is missing."""
    raise RuntimeError("memstream.streams.fetched_records.install() was not called")


class _RawPartitionRecords(_ORIGINAL):  # type: ignore[misc]
    def _consumer_record(self, tp: Any, record: Any) -> Any:
        if self._value_deserializer is not as_raw_record:
            return super()._consumer_record(tp, record)
        retry_for = None
        headers = record.headers
        if headers:
            for name, value in headers:
                if name == RETRY_FOR_HEADER and value:
                    retry_for = value.decode("utf-8", "replace")
        ts = record.timestamp
        value = record.value
        return new_raw_record(
            tp.topic,
            tp.partition,
            record.offset,
            record.key,
            ts / 1000.0 if ts is not None else None,
            retry_for,
            value if value is not None else b"",
            tuple(headers) if headers else (),
        )


def install() -> None:
    """Make aiokafka's fetcher build :class:`RawRecord` for ``as_raw_record`` consumers."""
    current = _fetcher.PartitionRecords
    if current is _RawPartitionRecords:
        return
    if current is not _ORIGINAL:
        raise RuntimeError(f"aiokafka's PartitionRecords was replaced by {current!r}")
    _fetcher.PartitionRecords = _RawPartitionRecords
