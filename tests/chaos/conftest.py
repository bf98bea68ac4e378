"""The chaos suite's fixture: a fresh data directory for one test, on Apache Kafka only
(Tansu keeps no data across a restart and has no CreatePartitions or real group
coordinator, so the faults these tests inject mean nothing on it)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def chaos_data(
    traversable_tmp: Path, kafka_broker_kind: str, request: pytest.FixtureRequest
) -> Path:
    if kafka_broker_kind != "kafka":
        pytest.skip("needs Apache Kafka (java and mvn): Tansu keeps no data across a restart")
    return traversable_tmp / f"{request.node.name}-{id(object())}"
