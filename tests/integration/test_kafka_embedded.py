"""The embedded brokers: start, serve, stop, and fail clearly (binary, port, last log lines)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from memstream.errors import PermanentInfraError, ServerStartError
from memstream.infra.embedded.kafka import (
    DEFAULT_KAFKA_VERSION,
    ApacheKafkaServer,
    TansuServer,
    resolve_kafka_jars,
)
from memstream.infra.kafka import Bus, ensure_topics, high_watermarks
from memstream.schemas.topics import Topics


@pytest.fixture
def busy_port() -> object:
    """A port something else is listening on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


async def test_tansu_serves_and_stops_without_leaving_a_process(tmp_path: Path) -> None:
    server = TansuServer(tmp_path)
    await server.start()
    pid = server.pid
    assert pid is not None
    topics = Topics("smoke.")
    assert await ensure_topics(server.address, topics, 2, 1)
    async with Bus(server.address) as bus:
        await bus.publish(topics.journal, "a/b/c", b"hello")
    assert sum((await high_watermarks(server.address, topics.journal)).values()) == 1
    await server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)
    await server.stop()  # idempotent


@pytest.mark.parametrize("cls", [TansuServer, ApacheKafkaServer])
async def test_taken_port_is_a_clear_error(cls: type, tmp_path: Path, busy_port: int) -> None:
    server = cls(tmp_path, port=busy_port)
    with pytest.raises(ServerStartError) as err:
        await server.start()
    assert str(busy_port) in err.value.message
    assert "already in use" in err.value.message
    assert not server.running


class _BrokenTansu(TansuServer):
    def command(self) -> list[str]:
        return [*super().command(), "--no-such-flag"]


async def test_server_that_exits_reports_binary_port_and_last_log_lines(tmp_path: Path) -> None:
    server = _BrokenTansu(tmp_path, startup_timeout=10)
    with pytest.raises(ServerStartError) as err:
        await server.start()
    msg = err.value.message
    assert "tansu" in msg
    assert str(server.port) in msg
    assert "exited with code" in msg
    assert "--no-such-flag" in msg  # the binary's own complaint, from its log
    assert not server.running


async def test_second_kafka_on_a_running_data_dir_is_refused(
    _kafka_server: ApacheKafkaServer | TansuServer, kafka_broker_kind: str
) -> None:
    if kafka_broker_kind != "kafka":
        pytest.skip("Apache Kafka not available (no java/mvn)")
    assert isinstance(_kafka_server, ApacheKafkaServer)
    second = ApacheKafkaServer(_kafka_server.data_dir, startup_timeout=20)
    with pytest.raises(ServerStartError) as err:
        await second.start()
    assert f"controller port {_kafka_server.controller_port}" in err.value.message
    assert _kafka_server.running


def test_jar_resolution_fills_a_fresh_cache_once(tmp_path: Path, kafka_broker_kind: str) -> None:
    if kafka_broker_kind != "kafka":
        pytest.skip("needs mvn")
    libs = resolve_kafka_jars(DEFAULT_KAFKA_VERSION, tmp_path)
    assert libs == tmp_path / DEFAULT_KAFKA_VERSION / "libs"
    jars = {p.name for p in libs.glob("*.jar")}
    assert f"kafka_2.13-{DEFAULT_KAFKA_VERSION}.jar" in jars
    assert f"kafka-clients-{DEFAULT_KAFKA_VERSION}.jar" in jars
    assert not list((tmp_path / DEFAULT_KAFKA_VERSION).glob("libs.tmp-*"))
    stamp = (libs / ".complete").stat().st_mtime_ns
    assert resolve_kafka_jars(DEFAULT_KAFKA_VERSION, tmp_path) == libs  # cached: no Maven
    assert (libs / ".complete").stat().st_mtime_ns == stamp


def test_unknown_kafka_version_is_a_clear_error(tmp_path: Path, kafka_broker_kind: str) -> None:
    with pytest.raises(PermanentInfraError, match="kafka_version"):
        resolve_kafka_jars("latest", tmp_path)
    if kafka_broker_kind != "kafka":
        return
    with pytest.raises(PermanentInfraError) as err:
        resolve_kafka_jars("0.0.1", tmp_path, attempts=1)
    assert "cannot resolve Apache Kafka 0.0.1" in err.value.message
    assert "kafka_2.13" in err.value.message  # Maven's own words about the missing artifact
    assert not (tmp_path / "0.0.1" / "libs").exists()
