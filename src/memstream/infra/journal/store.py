"""Where the journal lives: the SlateDB object store and DB path, built from settings.

- ``MEMSTREAM_JOURNAL_URL`` empty (the default): a local folder ``<data_dir>/journal``
  (created if missing), DB path ``MEMSTREAM_JOURNAL_PATH`` (default ``journal``) inside it.
- ``s3://bucket[/prefix]``: S3 (credentials and region from the usual ``AWS_*`` variables);
  the DB lives at ``prefix/<journal_path>`` in the bucket.
- ``memory:///``: an in-process store, for throwaway use only (lost at exit).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from slatedb.uniffi import ObjectStore, ObjectStoreBuilder, ObjectStoreType

from memstream.clock import Clock
from memstream.errors import InvalidRequest
from memstream.infra.journal.failures import SLATE_FAILURES, translate
from memstream.infra.journal.reader import JournalReader
from memstream.infra.journal.writer import Journal
from memstream.infra.metrics import Metrics
from memstream.infra.settings import Settings


def local_store(folder: Path) -> ObjectStore:
    """An object store rooted at ``folder`` (created if missing)."""
    folder = folder.expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    builder = ObjectStoreBuilder(ObjectStoreType.LOCAL)
    builder.with_config("local_path", str(folder))
    return builder.build()


def journal_location(settings: Settings) -> tuple[ObjectStore, str]:
    """The object store and DB path the settings point at."""
    url = settings.journal_url.strip()
    path = settings.journal_path.strip("/") or "journal"
    if not url:
        return local_store(settings.resolved_data_dir() / "journal"), path
    parts = urlsplit(url)
    try:
        if parts.scheme == "s3":
            if not parts.netloc:
                raise InvalidRequest("s3 journal URL needs a bucket", field="journal_url")
            builder = ObjectStoreBuilder.from_env(ObjectStoreType.S3)
            builder.with_url(f"s3://{parts.netloc}")
            prefix = parts.path.strip("/")
            return builder.build(), f"{prefix}/{path}" if prefix else path
        if parts.scheme == "memory":
            return ObjectStore.resolve("memory:///"), path
    except SLATE_FAILURES as e:
        raise translate(e, f"building the object store for {url!r}") from e
    raise InvalidRequest(
        "journal_url must be empty (local folder), s3://bucket[/prefix] or memory:///",
        field="journal_url",
    )


async def open_journal(
    settings: Settings, clock: Clock | None = None, metrics: Metrics | None = None
) -> Journal:
    """The journal writer the settings describe (fences any older writer)."""
    store, path = journal_location(settings)
    return await Journal.open(
        store,
        path,
        flush_interval_ms=settings.journal_flush_interval_ms,
        clock=clock,
        max_batch=settings.journal_max_batch,
        eager_flush=settings.journal_eager_flush,
        metrics=metrics,
    )


async def open_journal_reader(settings: Settings) -> JournalReader:
    """A read-only follower of the journal the settings describe."""
    store, path = journal_location(settings)
    return await JournalReader.open(store, path, poll_interval_ms=settings.journal_reader_poll_ms)
