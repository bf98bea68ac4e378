"""The memory index's layout: collection names, point ids, vector names, payload.

Pure: no I/O. Everything that decides *where* an entry lives in Qdrant is here, so a large
deployment can move to shared collections with a tenant payload index by changing
:func:`collection_name` (and adding ``account_id`` to the recall filter, which it already is).

- One collection per ``(account, environment)`` (the spec's layout).
- A point's id is ``uuid5`` of the entry identity ``(account_id, agent_id, owner, key)``;
  ``owner`` is the user id of a private entry and ``""`` for a shared one. The same entry
  always maps to the same point, so upserts and deletes are idempotent.
- Two named vectors: ``dense`` (size set by the embedder, cosine) and ``bm25`` (sparse,
  IDF modifier, from ``qdrant_edge.Bm25``).
- Payload: ``account_id, agent_id, owner, visibility, user_id, key, category, importance,
  expires_at`` (epoch seconds, or null), ``version``.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import Final, NamedTuple

from memstream.schemas.records import JSONObject, MemoryEntry

DENSE: Final = "dense"
SPARSE: Final = "bm25"

# Fixed namespace for point ids: changing it would orphan every existing point.
POINT_NAMESPACE: Final = uuid.UUID("6f1c1b8e-4b5e-5a52-9d0e-6d656d737472")

KEYWORD_FIELDS: Final = ("account_id", "agent_id", "owner", "visibility", "category", "key")
FLOAT_FIELDS: Final = ("expires_at", "importance")
INTEGER_FIELDS: Final = ("version",)

_SLUG = re.compile(r"[^a-z0-9]+")


class PointIdentity(NamedTuple):
    """The identity of one memory entry, as the recall service joins on it."""

    account_id: str
    agent_id: str
    owner: str
    key: str


def identity_of(entry: MemoryEntry) -> PointIdentity:
    return PointIdentity(entry.account_id, entry.agent_id, entry.owner, entry.key)


def point_id(identity: PointIdentity) -> str:
    """Deterministic point id (uuid5 string). Unambiguous: the parts are length-prefixed."""
    name = "".join(f"{len(p)}:{p}" for p in identity)
    return str(uuid.uuid5(POINT_NAMESPACE, name))


def _slug(s: str, n: int) -> str:
    return _SLUG.sub("-", s.lower()).strip("-")[:n] or "x"


def collection_name(account_id: str, environment: str) -> str:
    """The collection holding every memory point of one account in one environment.

    Readable (slugged environment and account) and collision-free (a hash of the exact pair),
    safe as a Qdrant collection name and as a directory name. The only place the layout of
    collections is decided.
    """
    digest = hashlib.sha256(f"{environment}\x00{account_id}".encode()).hexdigest()[:12]
    return f"mem-{_slug(environment, 24)}-{_slug(account_id, 40)}-{digest}"


def expires_epoch(entry: MemoryEntry) -> float | None:
    return entry.expires_at.timestamp() if entry.expires_at is not None else None


def payload_of(entry: MemoryEntry) -> JSONObject:
    """The filterable payload of an entry's point (never the content: Postgres has it)."""
    return {
        "account_id": entry.account_id,
        "agent_id": entry.agent_id,
        "owner": entry.owner,
        "visibility": entry.visibility,
        "user_id": entry.user_id,
        "key": entry.key,
        "category": entry.category,
        "importance": entry.importance,
        "expires_at": expires_epoch(entry),
        "version": entry.version,
    }


def identity_from_payload(payload: dict[str, object]) -> PointIdentity:
    return PointIdentity(
        str(payload.get("account_id", "")),
        str(payload.get("agent_id", "")),
        str(payload.get("owner", "")),
        str(payload.get("key", "")),
    )


def document_text(entry: MemoryEntry) -> str:
    """The text both vectors are computed from: the content (the key is an id, not prose)."""
    return entry.content


@dataclass(frozen=True, slots=True)
class RecallScope:
    """What a recall may see: one agent of one account, shared entries plus the caller's own
    private ones, not expired at ``now_epoch``, optionally one category."""

    account_id: str
    agent_id: str
    user_id: str | None
    now_epoch: float
    category: str | None = None
