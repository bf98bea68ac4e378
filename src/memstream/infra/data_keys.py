"""Crypto-shredding of the Kafka copies (issue 13): data keys, and sealed records.

Every record memstream publishes to Kafka that carries a thread's or a user's content is
**sealed**: encrypted with AES-256-GCM under that thread's (or user's) *data key*. Erasure
destroys the key (:meth:`Keyring.destroy`), so every copy of those records, in every topic,
retained segment, dead letter and broker backup, becomes unreadable at once, without
rewriting any log. Who seals and who opens (one place each side):

- the journal relay seals each envelope with its **thread's** key (``journal`` topic);
- :meth:`~memstream.streams.processor.ProcessorContext.publish` seals what processors
  publish about a thread (``summaries`` topic);
- the outbox relay seals ``memory.*`` events whose entry has a ``user_id`` and content with
  that **user's** key (``memory`` topic; shared entries without a user are never erased, and
  the content-free ``memory.forgotten`` of an erasure needs no key);
- the processor dispatcher and the replay's Kafka source open every record before anything
  reads it; a record whose key is gone is *shredded*: skipped and counted, never
  dead-lettered. Dead letters carry the sealed bytes, so they are shredded with the rest.

Record format (pure functions below)::

    MAGIC (4 bytes, b"\\x00MSK") | key id (16 bytes) | nonce (12 bytes) | ciphertext + tag

A JSON envelope never starts with a NUL byte, so unsealed records (written before sealing
was on, or content-free ones) pass through :meth:`Keyring.open_many` unchanged. The
associated data is the magic and the key id. Nonces are random, so a re-published record is
not byte-identical to the first publication (consumers dedupe by event id, unchanged).

Keys live in Postgres (``data_keys``: key id, scope, key bytes), which every process of a
deployment reaches. A key is created on first use, *before* any record sealed with it is
published; creation is refused for a thread in ``erased_threads`` and for a user whose
erasure is running, so nothing can re-key erased content while or after it is erased.
Each process caches keys for ``data_key_cache_s`` seconds: after an erasure, the erasing
process forgets the keys at once and every other process within that time. A key id not
found when opening is never cached (it is asked again with the next record sealed with it),
and every record skipped as shredded is logged with its position.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Final, Literal, NamedTuple

import asyncpg
import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.errors import InfraError, PermanentInfraError, RetryableInfraError
from memstream.infra.outage import is_transient
from memstream.infra.postgres import vacuum

__all__ = [
    "MAGIC",
    "Keyring",
    "Scope",
    "SealError",
    "is_sealed",
    "key_id_of",
    "memory_scope",
    "open_sealed",
    "seal",
    "thread_scope",
    "user_scope",
]

MAGIC: Final = b"\x00MSK"
KID_BYTES: Final = 16
NONCE_BYTES: Final = 12
HEADER_BYTES: Final = len(MAGIC) + KID_BYTES + NONCE_BYTES
#: What sealing adds to a record: header and GCM tag.
OVERHEAD_BYTES: Final = HEADER_BYTES + 16


class Scope(NamedTuple):
    """Whose key: ``kind`` ``"t"`` (a thread: account, agent, thread) or ``"u"`` (a user:
    account, user, with ``agent`` empty). A tuple: hashed in C on the relay's hot path."""

    kind: Literal["t", "u"]
    account_id: str
    agent_id: str
    name: str  # the thread id, or the user id

    @property
    def text(self) -> str:
        """The scope as stored (a JSON array: unambiguous whatever the ids hold)."""
        return orjson.dumps([self.kind, self.account_id, self.agent_id, self.name]).decode()


def thread_scope(account_id: str, agent_id: str, thread_id: str) -> Scope:
    return Scope("t", account_id, agent_id, thread_id)


def user_scope(account_id: str, user_id: str) -> Scope:
    return Scope("u", account_id, "", user_id)


def memory_scope(event: dict[str, object]) -> Scope | None:
    """The key a decoded ``memory.*`` event is sealed with: its entry's user, when the entry
    has one and carries content; None (published as is) otherwise. Pure."""
    data = event.get("data")
    entry = data.get("entry") if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        return None
    user, content = entry.get("user_id"), entry.get("content")
    if not isinstance(user, str) or not user or not content:
        return None
    return user_scope(str(event.get("account_id") or ""), user)


class SealError(ValueError):
    """A sealed record that does not open with its (existing) key: corrupt, not shredded."""


# --- pure format -----------------------------------------------------------------------------
def is_sealed(value: bytes) -> bool:
    return value[:4] == MAGIC


def key_id_of(value: bytes) -> bytes:
    return value[len(MAGIC) : len(MAGIC) + KID_BYTES]


def seal(aead: AESGCM, kid: bytes, plaintext: bytes) -> bytes:
    """``plaintext`` sealed under key ``kid`` (``aead`` is that key's cipher)."""
    nonce = os.urandom(NONCE_BYTES)
    head = MAGIC + kid
    return head + nonce + aead.encrypt(nonce, plaintext, head)


def open_sealed(aead: AESGCM, value: bytes) -> bytes:
    """The plaintext of a sealed record; SealError if it does not authenticate."""
    head = value[: len(MAGIC) + KID_BYTES]
    nonce = value[len(head) : HEADER_BYTES]
    try:
        return aead.decrypt(nonce, value[HEADER_BYTES:], head)
    except InvalidTag:
        raise SealError("sealed record does not authenticate under its key") from None


# --- keys in Postgres, cached --------------------------------------------------------------------
_KEY = tuple[bytes, AESGCM]  # (key id, cipher)

_CREATE = """
INSERT INTO data_keys (kid, scope, account_id, key)
SELECT u.kid, u.scope, u.account, u.key
FROM unnest($1::bytea[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[],
            $7::text[]) AS u(kid, scope, account, key, kind, agent, name)
WHERE NOT (u.kind = 't' AND EXISTS (
        SELECT 1 FROM erased_threads e WHERE e.account_id = u.account
        AND e.agent_id = u.agent AND e.thread_id = u.name))
  AND NOT (u.kind = 'u' AND EXISTS (
        SELECT 1 FROM erasures e WHERE e.account_id = u.account AND e.kind = 'user'
        AND e.user_id = u.name AND e.status = 'running'))
ON CONFLICT (scope) DO NOTHING
"""


class Keyring:
    """Data keys by scope (to seal) and by key id (to open), cached ``cache_s`` seconds."""

    def __init__(self, pool: asyncpg.Pool, *, cache_s: float = 60.0, max_cached: int = 100_000):
        self._pool = pool
        self._ttl = cache_s
        self._max = max_cached
        self._by_scope: dict[Scope, tuple[float, _KEY | None]] = {}
        self._by_kid: dict[bytes, tuple[float, AESGCM | None]] = {}
        self.shredded = 0  # records this process found with their key destroyed

    # --- sealing ------------------------------------------------------------------------
    async def keys_for(self, scopes: Iterable[Scope], *, create: bool = True) -> dict[Scope, _KEY]:
        """Each scope's key (created when missing and allowed); refused scopes are absent."""
        now = time.monotonic()
        out: dict[Scope, _KEY] = {}
        missing: list[Scope] = []
        for s in set(scopes):
            hit = self._by_scope.get(s)
            if hit is not None and hit[0] > now:
                if hit[1] is not None:
                    out[s] = hit[1]
                continue
            missing.append(s)
        if not missing:
            return out
        texts = [s.text for s in missing]
        try:
            if create:
                kids = [os.urandom(KID_BYTES) for _ in missing]
                await self._pool.execute(
                    _CREATE,
                    kids,
                    texts,
                    [s.account_id for s in missing],
                    [AESGCM.generate_key(bit_length=256) for _ in missing],
                    [s.kind for s in missing],
                    [s.agent_id for s in missing],
                    [s.name for s in missing],
                )
            rows = await self._pool.fetch(
                "SELECT scope, kid, key FROM data_keys WHERE scope = ANY($1::text[])", texts
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise _keys_error(e) from e
        found = {str(r["scope"]): (bytes(r["kid"]), AESGCM(bytes(r["key"]))) for r in rows}
        self._trim()
        for s, text in zip(missing, texts, strict=True):
            key = found.get(text)
            self._by_scope[s] = (now + self._ttl, key)
            if key is not None:
                out[s] = key
                self._by_kid[key[0]] = (now + self._ttl, key[1])
        return out

    async def seal_many(self, items: Sequence[tuple[Scope | None, bytes]]) -> list[bytes | None]:
        """Each value sealed under its scope's key; as is without a scope; None where the
        scope's key is refused (the thread or user is erased: publish nothing of it)."""
        keys = await self.keys_for({s for s, _ in items if s is not None})
        out: list[bytes | None] = []
        for s, value in items:
            if s is None:
                out.append(value)
                continue
            key = keys.get(s)
            out.append(None if key is None else seal(key[1], key[0], value))
        return out

    # --- opening ------------------------------------------------------------------------
    async def open_many(
        self, values: Sequence[bytes], keep_sealed: Sequence[bool] | None = None
    ) -> list[bytes | None]:
        """Each value opened (unsealed values as they are); None for a shredded one (its
        key was destroyed). A record that does not authenticate under its existing key is
        returned as it is (it then fails to decode: a dead letter, like any corrupt
        record). ``keep_sealed[i]``: value ``i`` is only checked, not opened (returned as it
        is if its key exists, None if shredded). Raises RetryableInfraError when Postgres is
        away."""
        now = time.monotonic()
        wanted: set[bytes] = set()
        for v in values:
            if is_sealed(v):
                kid = key_id_of(v)
                hit = self._by_kid.get(kid)
                if hit is None or hit[0] <= now:
                    wanted.add(kid)
        if wanted:
            try:
                rows = await self._pool.fetch(
                    "SELECT kid, key FROM data_keys WHERE kid = ANY($1::bytea[])", list(wanted)
                )
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                raise _keys_error(e) from e
            found = {bytes(r["kid"]): AESGCM(bytes(r["key"])) for r in rows}
            self._trim()
            for kid, cipher in found.items():
                # found keys only: a miss is asked again next time, never cached, so a
                # key that was not visible yet cannot shred its records for cache_s
                self._by_kid[kid] = (now + self._ttl, cipher)
            for kid in wanted - found.keys():
                self._by_kid.pop(kid, None)
        out: list[bytes | None] = []
        for i, v in enumerate(values):
            if not is_sealed(v):
                out.append(v)
                continue
            entry = self._by_kid.get(key_id_of(v))
            aead = entry[1] if entry is not None else None
            if aead is None:
                self.shredded += 1
                out.append(None)
            elif keep_sealed is not None and keep_sealed[i]:
                out.append(v)
            else:
                try:
                    out.append(open_sealed(aead, v))
                except SealError:
                    out.append(v)
        return out

    # --- erasure ------------------------------------------------------------------------
    async def destroy(self, scopes: Sequence[Scope], *, rewrite: bool = False) -> int:
        """Delete the keys of ``scopes`` (every record sealed with them is shredded), then
        vacuum the table (:func:`~memstream.infra.postgres.vacuum`; ``rewrite``: the key
        bytes also leave its files, without which a copy of the data folder would open the
        shredded records again). Returns how many were deleted."""
        if not scopes:
            return 0
        rows = await self._pool.fetch(
            "DELETE FROM data_keys WHERE scope = ANY($1::text[]) RETURNING kid",
            [s.text for s in scopes],
        )
        self.forget(scopes)
        for r in rows:
            self._by_kid.pop(bytes(r["kid"]), None)
        await vacuum(self._pool, "data_keys", rewrite=rewrite)
        return len(rows)

    def forget(self, scopes: Iterable[Scope]) -> None:
        """Drop ``scopes`` from this process's caches (their key ids too)."""
        for s in scopes:
            hit = self._by_scope.pop(s, None)
            if hit is not None and hit[1] is not None:
                self._by_kid.pop(hit[1][0], None)

    def _trim(self) -> None:
        if len(self._by_scope) > self._max:
            self._by_scope.clear()
        if len(self._by_kid) > self._max:
            self._by_kid.clear()


def _keys_error(e: Exception) -> InfraError:
    """Postgres away: retryable (a processor pauses); any other refusal (a missing table,
    a permission) fails the same way again, so it is not dressed up as an outage."""
    if is_transient(e):
        return RetryableInfraError(f"data keys: {e}")
    return PermanentInfraError(f"data keys: {e}")
