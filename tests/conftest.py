"""Root conftest: registers the fixture modules, one per area (each owned by its area).

Server fixtures are session-scoped and launch real servers from Python packages (or, for
Apache Kafka, from Maven Central jars). Nothing here fakes Kafka, Postgres, Redis, Qdrant,
ClickHouse or SlateDB.
"""

from hypothesis import HealthCheck, settings

# Property tests run on a 2-core machine shared with real servers: a slow draw or example is
# load, not a defect. Keep every example's check, drop the wall-clock health checks.
settings.register_profile(
    "memstream",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("memstream")

pytest_plugins = [
    "tests.fixtures.stores",  # embedded Postgres and Valkey (Redis)
    "tests.fixtures.kafka",  # Apache Kafka (and Tansu for the smoke subset)
    "tests.fixtures.openai_server",  # a local OpenAI-compatible test server
    "tests.fixtures.api",  # the FastAPI app over real stores, through httpx
    "tests.fixtures.journal",  # SlateDB journal on a fresh local folder
    "tests.fixtures.clickhouse",  # chdb (embedded ClickHouse), one engine per session
    "tests.fixtures.embeddings",  # the offline embedder; the dense side's two paths
]
