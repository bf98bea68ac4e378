"""The hook that lets aiokafka's fetcher build our RawRecord is where this code expects it."""

from __future__ import annotations

import pytest
from aiokafka.consumer import fetcher

from memstream.streams import fetched_records


def test_aiokafka_still_builds_its_records_in_the_hook_we_replace() -> None:
    # the fetcher builds PartitionRecords by name, and each record in _consumer_record: an
    # aiokafka upgrade that moves either must fail here, not silently slow the consumer
    fetched_records.install()
    assert fetcher.PartitionRecords.__name__ == "_RawPartitionRecords"
    assert "_consumer_record" in vars(fetcher.PartitionRecords.__mro__[1])
    assert "PartitionRecords(" in open(fetcher.__file__).read()  # noqa: SIM115, PTH123


def test_install_is_idempotent_and_refuses_anyone_elses_replacement() -> None:
    fetched_records.install()
    fetched_records.install()
    ours = fetcher.PartitionRecords
    fetcher.PartitionRecords = type("Theirs", (ours.__mro__[1],), {})
    try:
        with pytest.raises(RuntimeError, match="was replaced"):
            fetched_records.install()
    finally:
        fetcher.PartitionRecords = ours


def test_the_marker_deserializer_says_what_is_missing_if_ever_called() -> None:
    with pytest.raises(RuntimeError, match=r"install\(\) was not called"):
        fetched_records.as_raw_record(b"v")
