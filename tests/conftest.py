"""Root conftest: registers the fixture modules, one per area (each owned by its area).

Server fixtures are session-scoped and launch real servers from Python packages (or, for
Apache Kafka, from Maven Central jars). Nothing here fakes Kafka, Postgres, Redis, Qdrant,
ClickHouse or SlateDB.
"""

pytest_plugins = [
    "tests.fixtures.stores",  # embedded Postgres and Valkey (Redis)
    "tests.fixtures.kafka",  # Apache Kafka (and Tansu for the smoke subset)
    "tests.fixtures.api",  # the FastAPI app over real stores, through httpx
    "tests.fixtures.journal",  # SlateDB journal on a fresh local folder
    "tests.fixtures.clickhouse",  # chdb (embedded ClickHouse), one engine per session
]
