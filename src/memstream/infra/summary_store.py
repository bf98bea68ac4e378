"""The summary store: ``summary.json`` in object storage, cached in Redis for one hour.

Layout (``obstore``: a local folder ``<data_dir>/objects`` by default, or the
``object_store_url`` such as ``s3://bucket/prefix``)::

    accounts/{account_id}/agents/{agent_id}/threads/{thread_id}/summary.json      latest
    accounts/{account_id}/agents/{agent_id}/threads/{thread_id}/summary.v{N}.json  version N

Optimistic versioning. A local object store cannot overwrite conditionally (INFRA.md), so a
writer **claims** version N by creating the immutable ``summary.vN.json`` with
``mode="create"``: exactly one writer can create it, the loser gets
:class:`~memstream.errors.Conflict`. Only then is ``summary.json`` overwritten. The same code
runs on S3 (which supports create-if-absent too).

Guarantees:

- Each version is written by exactly one writer; versions are dense (writing N requires
  N-1 to exist), so a race yields 1, 2, 3... with no gap and no duplicate.
- Reads never go backwards: :meth:`SummaryStore.get` takes ``summary.json`` and then looks for
  newer claimed versions (a writer may have claimed N+1 and not yet updated ``summary.json``);
  a writer that finds a newer version after updating ``summary.json`` rewrites it with the
  newest, so ``summary.json`` converges on the newest version.
- The Redis cache (``SUMMARY_CACHE_TTL_SECONDS``) is refilled on a miss and only ever moves
  forward (a Lua compare on ``version``). Wiping Redis changes nothing that is read back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, cast
from urllib.parse import quote

import obstore
import orjson
import redis.asyncio as aioredis
from obstore.exceptions import AlreadyExistsError, NotFoundError
from obstore.store import LocalStore, ObjectStore, from_url
from redis.exceptions import RedisError

from memstream.errors import Conflict, InvalidRequest, RetryableInfraError
from memstream.infra import redis_keys
from memstream.infra.redis_aof import rewrite_append_log
from memstream.infra.settings import Settings
from memstream.schemas.limits import SUMMARY_CACHE_TTL_SECONDS
from memstream.schemas.records import Summary, ThreadRef

log = logging.getLogger(__name__)

# Set the cached summary only if the key is absent or holds an older version.
_CACHE_IF_NEWER: Final = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and type(doc) == 'table' and tonumber(doc['version']) and
     tonumber(doc['version']) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""


def open_object_store(settings: Settings) -> ObjectStore:
    """The object store for summaries: ``object_store_url`` or ``<data_dir>/objects``."""
    url = settings.object_store_url.strip()
    if not url:
        folder = Path(settings.resolved_data_dir()) / "objects"
        folder.mkdir(parents=True, exist_ok=True)
        return LocalStore(prefix=folder, mkdir=True)
    try:
        return from_url(url)
    except Exception as e:  # obstore raises several types for a bad URL
        raise InvalidRequest(f"bad object_store_url: {e}", field="object_store_url") from e


#: Longest path segment an id is written as; longer encodings are replaced by their hash.
SEGMENT_MAX_CHARS = 120


def key_segment(value: str) -> str:
    """One id as an object-store path segment that cannot leave its prefix (pure).

    The id percent-encoded (``/`` included), unless that would be ``.``/``..``-like (starts
    with ``.``), start with ``~`` (reserved here) or exceed :data:`SEGMENT_MAX_CHARS`: then
    ``~`` and the SHA-256 of the id (stable, so the same id always finds its summary)."""
    enc = quote(value, safe="")
    if enc and not enc.startswith((".", "~")) and len(enc) <= SEGMENT_MAX_CHARS:
        return enc
    return "~" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def thread_folder(ref: ThreadRef) -> str:
    """``accounts/{a}/agents/{g}/threads/{t}``, each id as a :func:`key_segment`."""
    q = key_segment
    return f"accounts/{q(ref.account_id)}/agents/{q(ref.agent_id)}/threads/{q(ref.thread_id)}"


def summary_path(ref: ThreadRef) -> str:
    return f"{thread_folder(ref)}/summary.json"


def version_path(ref: ThreadRef, version: int) -> str:
    return f"{thread_folder(ref)}/summary.v{version}.json"


def _encode(summary: Summary) -> bytes:
    return orjson.dumps(summary.to_dict())


def _decode(raw: bytes) -> Summary:
    return Summary.from_dict(orjson.loads(raw))


ERASE_KEYS_BATCH: Final = 500
"""Keys an erasure deletes per ``DEL``."""
LISTINGS_AT_ONCE: Final = 32
"""Threads' folders listed (or their summaries read) at once by :meth:`SummaryStore.stored_many`
against a remote object store."""


class SummaryStore:
    """Thread summaries: object storage (authoritative) with a Redis read cache."""

    def __init__(
        self,
        store: ObjectStore,
        redis: aioredis.Redis,
        *,
        cache_ttl_s: int = SUMMARY_CACHE_TTL_SECONDS,
    ) -> None:
        self._store = store
        # a local folder's root: a thread with no folder there has nothing stored, which
        # the file system answers for ~4 µs of CPU where obstore's listing takes ~38
        prefix = store.prefix if isinstance(store, LocalStore) else None
        self._local_root: Path | None = Path(prefix) if prefix is not None else None
        self._redis = redis
        self._ttl = cache_ttl_s
        self._cache_if_newer = redis.register_script(_CACHE_IF_NEWER)

    # --- reads ---------------------------------------------------------------------------------
    async def get(self, ref: ThreadRef) -> Summary | None:
        """The thread's summary: Redis if cached, else object storage (and refill the cache)."""
        try:
            raw = await self._redis.get(redis_keys.summary_cache(ref))
        except RedisError as e:
            log.warning("summary cache read failed for %s, reading storage: %s", ref.key, e)
            raw = None
        if raw is not None:
            try:
                return _decode(cast(bytes, raw))
            except Exception:  # a corrupt cache entry is only a miss
                log.warning("ignoring an unreadable cached summary for %s", ref.key)
        summary = await self.get_stored(ref)
        if summary is not None:
            await self.cache(ref, summary)
        return summary

    async def get_stored(self, ref: ThreadRef) -> Summary | None:
        """The newest summary in object storage (bypasses the cache).

        A thread with nothing stored (what the counters processor meets for every new
        thread) costs one listing of its folder instead of two failed reads (``summary.json``,
        then ``summary.v1.json``, each a raised not-found): bench/summary_lookup.py."""
        if not await asyncio.to_thread(self._has_objects, ref):
            return None
        return await self._newest(ref)

    async def _newest(self, ref: ThreadRef) -> Summary | None:
        """The newest summary of a thread whose folder holds objects."""
        latest = await self._read(summary_path(ref))
        version = latest.version if latest is not None else 0
        newest = latest
        while True:  # a claimed version may be newer than summary.json
            nxt = await self._read(version_path(ref, version + 1))
            if nxt is None:
                return newest
            newest, version = nxt, nxt.version

    async def stored_many(self, refs: Sequence[ThreadRef]) -> list[Summary | None]:
        """:meth:`get_stored` of each of ``refs``, in order: what the counters processor
        asks for the threads of a batch new to Redis (usually new threads, with nothing
        stored).

        Their folders are listed on one worker thread, one after another for a local folder
        and :data:`LISTINGS_AT_ONCE` at a time for a remote store (:meth:`_has_objects`).
        Only the threads with objects are read further, :data:`LISTINGS_AT_ONCE` at a
        time."""
        if not refs:
            return []
        stored = await asyncio.to_thread(self._have_objects, list(refs))
        slots = asyncio.Semaphore(LISTINGS_AT_ONCE)

        async def newest(ref: ThreadRef, has: bool) -> Summary | None:
            if not has:
                return None
            async with slots:
                return await self._newest(ref)

        return list(await asyncio.gather(*map(newest, refs, stored)))

    def _have_objects(self, refs: list[ThreadRef]) -> list[bool]:
        """Blocking: whether each thread's folder holds an object."""
        if isinstance(self._store, LocalStore) or len(refs) == 1:
            return [self._has_objects(r) for r in refs]
        with ThreadPoolExecutor(LISTINGS_AT_ONCE, thread_name_prefix="summary-list") as pool:
            return list(pool.map(self._has_objects, refs))

    def _has_objects(self, ref: ThreadRef) -> bool:
        """Blocking: whether the thread's folder holds an object. A blocking obstore call
        (run on a worker thread) costs ~34 µs of this process's CPU where an awaited one
        costs ~225 (bench/summary_lookup.py); on a local folder a thread without one (a new
        thread, the common case) is answered by the file system first."""
        folder = thread_folder(ref)
        try:
            if self._local_root is not None and not (self._local_root / folder).is_dir():
                return False  # a new thread: no folder (segments are the folder names as is)
            listed = obstore.list_with_delimiter(self._store, folder)
        except (NotFoundError, FileNotFoundError):
            return False
        except Exception as e:
            raise RetryableInfraError(f"object store listing of {ref.key} failed: {e}") from e
        return bool(listed["objects"])

    async def get_version(self, ref: ThreadRef, version: int) -> Summary | None:
        """One immutable version, or None."""
        return await self._read(version_path(ref, version))

    async def _read(self, path: str) -> Summary | None:
        try:
            result = await obstore.get_async(self._store, path)
            raw = await result.bytes_async()
        except NotFoundError:
            return None
        except FileNotFoundError:
            return None
        except Exception as e:
            raise RetryableInfraError(f"object store read of {path} failed: {e}") from e
        return _decode(bytes(raw))

    # --- writes --------------------------------------------------------------------------------
    async def write(self, ref: ThreadRef, summary: Summary, expected_previous_version: int) -> None:
        """Write ``summary`` as version ``expected_previous_version + 1``.

        Raises :class:`Conflict` if another writer already claimed that version (re-read and
        decide again), or if ``expected_previous_version`` does not exist.
        """
        if summary.version != expected_previous_version + 1:
            raise InvalidRequest(
                f"version must be {expected_previous_version + 1}", field="version"
            )
        if (
            expected_previous_version > 0
            and await self.get_version(ref, expected_previous_version) is None
        ):
            raise Conflict(f"summary version {expected_previous_version} does not exist")
        body = _encode(summary)
        try:
            await obstore.put_async(
                self._store, version_path(ref, summary.version), body, mode="create"
            )
        except AlreadyExistsError:
            raise Conflict(
                f"summary version {summary.version} of {ref.key} was written by another writer"
            ) from None
        except FileExistsError:
            raise Conflict(
                f"summary version {summary.version} of {ref.key} was written by another writer"
            ) from None
        except Exception as e:
            raise RetryableInfraError(f"object store write failed: {e}") from e
        await self._publish_latest(ref, summary, body)
        await self.cache(ref, summary)

    async def _publish_latest(self, ref: ThreadRef, summary: Summary, body: bytes) -> None:
        """Overwrite summary.json; if a newer version was claimed meanwhile, converge on it."""
        current, current_body = summary, body
        while True:
            try:
                await obstore.put_async(self._store, summary_path(ref), current_body)
            except Exception as e:
                raise RetryableInfraError(f"object store write failed: {e}") from e
            newer = await self.get_version(ref, current.version + 1)
            if newer is None:
                return
            newest = newer
            while (n := await self.get_version(ref, newest.version + 1)) is not None:
                newest = n
            current, current_body = newest, _encode(newest)

    async def cache(self, ref: ThreadRef, summary: Summary) -> None:
        """Cache ``summary`` for the TTL unless a newer version is cached (best effort)."""
        try:
            await self.refresh_cache(ref, summary)
        except RetryableInfraError as e:
            log.warning("summary cache write failed for %s: %s", ref.key, e)

    async def refresh_cache(self, ref: ThreadRef, summary: Summary) -> None:
        """:meth:`cache`, raising :class:`RetryableInfraError` when Redis fails. For the
        steps that apply a summary to the counters: a cache left at an older version (its
        write failed while Valkey restarted, or Valkey lost it in a kill) would be read back
        by :meth:`get`, the context included, for up to the TTL, while the counters already
        count from the newer summary on: the messages between the two summaries in neither.
        Caching before applying keeps "applied" implying "cached" through a loss of Valkey's
        latest writes (its AOF and replicas keep writes in order)."""
        try:
            await self._cache_if_newer(
                keys=[redis_keys.summary_cache(ref)],
                args=[_encode(summary), summary.version, self._ttl],
            )
        except RedisError as e:
            raise RetryableInfraError(f"summary cache write failed for {ref.key}: {e}") from e

    async def ping(self) -> None:
        """Raise unless the object store answers (a HEAD of a key that need not exist)."""
        try:
            await obstore.head_async(self._store, "readiness-probe")
        except (NotFoundError, FileNotFoundError):
            return

    # --- erasure -------------------------------------------------------------------------------
    async def erase_objects(self, ref: ThreadRef) -> int:
        """Delete every summary object of the thread (``summary.json`` and the versions);
        how many. Idempotent."""
        objects = 0
        try:
            async for batch in obstore.list(self._store, prefix=thread_folder(ref) + "/"):
                paths = [meta["path"] for meta in batch]
                try:  # one call for the listed page
                    await obstore.delete_async(self._store, paths)
                    objects += len(paths)
                except (NotFoundError, FileNotFoundError):
                    for path in paths:  # one went meanwhile (another run of this erasure)
                        try:
                            await obstore.delete_async(self._store, path)
                            objects += 1
                        except (NotFoundError, FileNotFoundError):
                            pass
        except Exception as e:
            raise RetryableInfraError(f"object store erase failed: {e}") from e
        return objects

    async def erase_keys(self, refs: Sequence[ThreadRef]) -> int:
        """Delete every Redis key of the threads (cache, lock, counters, guard, watermark,
        claims); how many. One pass over the keyspace for all of them (keys with offsets
        and spans in their names cannot be listed by name), not one per thread: a SCAN
        visits every key of the database, 38 ms a thread at 20k keys. Idempotent."""
        tags = {redis_keys.thread_base(ref) for ref in refs}
        if not tags:
            return 0
        deleted = 0
        try:
            found: list[bytes] = []
            async for key in self._redis.scan_iter(match=redis_keys.THREAD_KEYS, count=1_000):
                name = key.decode() if isinstance(key, bytes) else str(key)
                if redis_keys.thread_base_of(name) in tags:
                    found.append(key)
                    if len(found) >= ERASE_KEYS_BATCH:
                        deleted += int(await self._redis.delete(*found))
                        found = []
            if found:
                deleted += int(await self._redis.delete(*found))
        except RedisError as e:
            raise RetryableInfraError(f"Redis erase failed: {e}") from e
        return deleted

    async def rewrite_log(self) -> bool:
        """After :meth:`erase_keys`: rewrite Valkey's append-only file, so the deleted keys'
        writes (a cached summary's text) leave it too (:mod:`~memstream.infra.redis_aof`)."""
        return await rewrite_append_log(self._redis)
