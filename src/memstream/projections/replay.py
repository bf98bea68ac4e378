"""Replay and rebuild of a projection into a fresh generation, then an atomic switch.

``memstream replay PROJECTION`` (and ``POST /admin/replay/{projection}``) drive
:func:`run_replay`. The projection's *generation* is its "current" pointer, kept in Postgres
(``projection_state``): generation 1 is the original table/collection/keys, generation N+1 is
built beside it (``messages_v2``-style names, see :mod:`.replay_sinks`). The steps:

1. **Replay.** Take the source's end positions now (Kafka high-water marks per partition, or
   the journal's last seq with ``--from-journal``) and read from the start up to them into
   generation N+1, while the live projector keeps serving (and writing) generation N.
   Duplicates (same event id: a republished record) are skipped and counted.
2. **Hand-over.** Close the live projector's :class:`Gate` (it finishes the batch in hand and
   waits), take the end positions again, replay the gap (every event the live projector could
   have applied to generation N is below them), point the live projector and the readers at
   generation N+1 (:meth:`ReplaySink.switch`), record the pointer, open the gate. The live
   projector then goes on from its own committed offsets into N+1; anything it re-applies is
   idempotent. No event is lost: each one is below the hand-over ends (replayed) or above
   them (applied live to N+1).
3. **Drop** generation N.

Resumable: the state (target generation, end positions, next offset per partition, counts)
is checkpointed to Postgres after each batch at most every ``checkpoint_every_s``; a new run
continues from the checkpoint (``restart=True`` starts over). Since sinks are idempotent,
re-reading the batches after the last checkpoint is harmless.

Readers of a process that does not host the live projector (split deployments) pick up the
new generation at their next start (:func:`apply_generations` in the composition root).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Protocol, TypeVar

import asyncpg

from memstream.errors import InvalidRequest
from memstream.schemas.events import DecodeError, Envelope, decode

__all__ = [
    "PROJECTIONS",
    "BulkReplaySink",
    "SealingSink",
    "Gate",
    "Progress",
    "ReplaySink",
    "ReplaySource",
    "ReplayState",
    "ReplayStateStore",
    "SourceBatch",
    "check_projection",
    "run_replay",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

PROJECTIONS: Final = ("messages", "memory", "counters")
SourceKind = Literal["topic", "journal"]


def check_projection(name: object) -> str:
    if not isinstance(name, str) or name not in PROJECTIONS:
        raise InvalidRequest(
            f"projection must be one of {', '.join(PROJECTIONS)}", field="projection"
        )
    return name


# --- the live projector's gate --------------------------------------------------------------
class Gate:
    """Held by the live projector around each batch, and by a replay during its hand-over, so
    a switch never happens in the middle of a live write."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @property
    def closed(self) -> bool:
        return self._lock.locked()

    async def __aenter__(self) -> Gate:
        await self._lock.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()


# --- sources and sinks ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceBatch:
    """Records of the source, in order per partition (Kafka partitions, or partition 0 and
    journal seqs): their values, and per partition read the position after the batch's
    last record (records left out by the source, such as shredded ones, are behind it too).
    Columns rather than one object per record: a replay touches each record only to hand
    its bytes on."""

    values: list[bytes]
    next: dict[int, int]


class ReplaySource(Protocol):
    kind: SourceKind

    async def starts(self) -> dict[int, int]:
        """First position per partition (log start offsets; journal: ``{0: 1}``)."""
        ...

    async def ends(self) -> dict[int, int]:
        """End position (exclusive) per partition, now."""
        ...

    def read(
        self, start: Mapping[int, int], end: Mapping[int, int], batch: int
    ) -> AsyncGenerator[SourceBatch, None]:
        """Batches of records with ``start[p] <= offset < end[p]``, in order per partition."""
        ...


class ReplaySink(Protocol):
    """One projection's rebuild target. Every method is idempotent."""

    name: str

    def restore(self, extra: dict[str, list[str]]) -> None:
        """Take back the bookkeeping saved in a checkpoint (e.g. the accounts seen)."""
        ...

    def bookkeeping(self) -> dict[str, list[str]]:
        """What to save with a checkpoint so :meth:`drop` still works after a resume."""
        ...

    async def prepare(self, generation: int, *, fresh: bool) -> None:
        """Create the target of ``generation`` (``fresh``: delete whatever is there first)."""
        ...

    async def apply(self, generation: int, events: Sequence[Envelope]) -> tuple[int, int]:
        """Apply events (in order, no repeated event id); ``(rows written, duplicates)``."""
        ...

    async def switch(self, generation: int) -> None:
        """Point the live projector and the readers of this process at ``generation``."""
        ...

    async def drop(self, generation: int) -> None:
        """Delete the target of ``generation`` (the one replaced)."""
        ...


BulkParse = Callable[[int, Sequence[bytes]], Awaitable[Any]]
BulkWrite = Callable[[int, Any, set[str]], Awaitable[tuple[int, int]]]


class BulkReplaySink(Protocol):
    """A sink that can also take a batch of raw records in bulk (``messages``: pyarrow parses
    them, as for the live projector), skipping Python's decode. A batch is parsed, then
    written: :func:`run_replay` parses batch N+1 while batch N is written (the parse runs
    off the event loop, the write in the store's worker), and writes in order."""

    async def parse_values(self, generation: int, values: Sequence[bytes]) -> Any:
        """The batch parsed (nothing written, nothing deduped), or None when the bulk path
        cannot vouch for it (the replay then decodes it in Python). May run while the
        previous batch's :meth:`write_values` runs."""
        ...

    async def write_values(self, generation: int, parsed: Any, seen: set[str]) -> tuple[int, int]:
        """Write a parsed batch but its records whose event id is in ``seen`` (then add the
        batch's ids to it); ``(rows written, duplicates)``. Called in batch order, one at a
        time."""
        ...


class SealingSink(Protocol):
    """A sink that defers part of its rebuild until the bulk copy is done (``messages``:
    the posting lists, filled in one statement rather than inside every insert; the old
    generation's vectors carried over and the vector index filled, so the switch under the
    gate has only what came since to carry)."""

    async def seal(self, generation: int) -> None:
        """Finish ``generation`` before the hand-over (idempotent; a resumed replay may call
        it again). After it returns, writes into ``generation`` are complete as they land,
        as the live projector's are."""
        ...


# --- state ----------------------------------------------------------------------------------
@dataclass
class ReplayState:
    """A replay's checkpoint (JSON in ``projection_state.replay``)."""

    projection: str
    generation: int
    previous: int
    source: SourceKind
    starts: dict[int, int]
    ends: dict[int, int]
    next: dict[int, int]
    events_read: int = 0
    rows_written: int = 0
    duplicates_skipped: int = 0
    undecodable: int = 0
    elapsed_s: float = 0.0
    resumed: int = 0
    extra: dict[str, list[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(max(0, e - self.starts.get(p, 0)) for p, e in self.ends.items())

    @property
    def done(self) -> int:
        return sum(
            max(0, min(self.next.get(p, 0), e) - self.starts.get(p, 0))
            for p, e in self.ends.items()
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("starts", "ends", "next"):
            d[k] = {str(p): o for p, o in d[k].items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReplayState:
        def parts(v: object) -> dict[int, int]:
            return {int(p): int(o) for p, o in dict(v or {}).items()}  # type: ignore[call-overload]

        return cls(
            projection=str(d["projection"]),
            generation=int(d["generation"]),
            previous=int(d["previous"]),
            source="journal" if d.get("source") == "journal" else "topic",
            starts=parts(d.get("starts")),
            ends=parts(d.get("ends")),
            next=parts(d.get("next")),
            events_read=int(d.get("events_read", 0)),
            rows_written=int(d.get("rows_written", 0)),
            duplicates_skipped=int(d.get("duplicates_skipped", 0)),
            undecodable=int(d.get("undecodable", 0)),
            elapsed_s=float(d.get("elapsed_s", 0.0)),
            resumed=int(d.get("resumed", 0)),
            extra={str(k): [str(x) for x in v] for k, v in dict(d.get("extra") or {}).items()},
        )


class ReplayStateStore:
    """Generations and replay checkpoints in Postgres (``projection_state``)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def generation(self, name: str) -> int:
        v = await self._pool.fetchval(
            "SELECT generation FROM projection_state WHERE name = $1", name
        )
        return int(v) if v is not None else 1

    async def generations(self) -> dict[str, int]:
        rows = await self._pool.fetch("SELECT name, generation FROM projection_state")
        return {str(r["name"]): int(r["generation"]) for r in rows}

    async def load(self, name: str) -> ReplayState | None:
        v = await self._pool.fetchval("SELECT replay FROM projection_state WHERE name = $1", name)
        if v is None:
            return None
        import orjson

        return ReplayState.from_json(orjson.loads(v) if isinstance(v, str | bytes) else v)

    async def save(self, state: ReplayState) -> None:
        await self._pool.execute(
            "INSERT INTO projection_state (name, replay) VALUES ($1, $2::jsonb) "
            "ON CONFLICT (name) DO UPDATE SET replay = EXCLUDED.replay, updated_at = now()",
            state.projection,
            state.to_json(),
        )

    async def finish(self, name: str, generation: int) -> None:
        """Make ``generation`` current and forget the checkpoint, in one statement."""
        await self._pool.execute(
            "INSERT INTO projection_state (name, generation, replay) VALUES ($1, $2, NULL) "
            "ON CONFLICT (name) DO UPDATE SET generation = EXCLUDED.generation, replay = NULL, "
            "updated_at = now()",
            name,
            generation,
        )


# --- progress -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Progress:
    """One progress line (``type`` "progress") or the final report (``type`` "report")."""

    type: Literal["start", "progress", "report"]
    projection: str
    phase: str
    generation: int
    previous: int
    source: str
    done: int
    total: int
    events_read: int
    rows_written: int
    duplicates_skipped: int
    undecodable: int
    elapsed_s: float
    resumed: bool

    @property
    def rate(self) -> float:
        return self.events_read / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["rate"] = round(self.rate, 1)
        d["elapsed_s"] = round(self.elapsed_s, 3)
        return d


def _progress(st: ReplayState, typ: Literal["start", "progress", "report"], phase: str) -> Progress:
    return Progress(
        type=typ,
        projection=st.projection,
        phase=phase,
        generation=st.generation,
        previous=st.previous,
        source=st.source,
        done=st.done,
        total=st.total,
        events_read=st.events_read,
        rows_written=st.rows_written,
        duplicates_skipped=st.duplicates_skipped,
        undecodable=st.undecodable,
        elapsed_s=st.elapsed_s,
        resumed=st.resumed > 0,
    )


# --- the run --------------------------------------------------------------------------------
async def run_replay(  # noqa: PLR0915 - one linear procedure, read top to bottom
    sink: ReplaySink,
    source: ReplaySource,
    store: ReplayStateStore,
    *,
    gate: Gate | None = None,
    restart: bool = False,
    batch_size: int = 2_000,
    checkpoint_every_s: float = 1.0,
    progress_every_s: float = 0.25,
    now: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[Progress, None]:
    """Rebuild ``sink``'s projection from ``source``; yields progress, then the report.

    Cancelling the iteration (Ctrl-C, a dropped HTTP client) leaves a checkpoint that the next
    run resumes from; the current generation is untouched until the hand-over.
    """
    name = sink.name
    current = await store.generation(name)
    st = None if restart else await store.load(name)
    if st is not None and (st.source != source.kind or st.generation <= current):
        st = None  # another source, or a stale checkpoint: start over
    if st is None:
        gen = current + 1
        starts = await source.starts()
        ends = await source.ends()
        st = ReplayState(
            name, gen, current, source.kind, starts=starts, ends=ends, next=dict(starts)
        )
        await sink.prepare(gen, fresh=True)
        await store.save(st)
    else:
        st.resumed += 1
        sink.restore(st.extra)
        await sink.prepare(st.generation, fresh=False)
    seen: set[str] = set()
    clock_base = now() - st.elapsed_s
    last_save = last_progress = now()
    yield _progress(st, "start", "replay")

    parse_values: BulkParse | None = getattr(sink, "parse_values", None)
    write_values: BulkWrite | None = getattr(sink, "write_values", None)

    async def apply_decoded(batch: SourceBatch) -> tuple[int, int]:
        events: list[Envelope] = []
        dups = 0
        for value in batch.values:
            try:
                env = decode(value)
            except DecodeError:
                st.undecodable += 1
                continue
            if env.id in seen:
                dups += 1
                continue
            seen.add(env.id)
            events.append(env)
        if not events:
            return 0, dups
        written, more = await sink.apply(st.generation, events)
        return written, dups + more

    async def parse(batch: SourceBatch) -> Any:
        if parse_values is None or not batch.values:
            return None
        return await parse_values(st.generation, batch.values)

    async def apply(batch: SourceBatch, parsed: Any) -> tuple[int, int]:
        if parsed is None or write_values is None:
            return await apply_decoded(batch)
        return await write_values(st.generation, parsed, seen)

    async def copy(until: dict[int, int], phase: str) -> AsyncGenerator[Progress, None]:
        """Batches from ``st.next`` up to ``until``: batch N+2 read from the source, N+1
        parsed and N written at once; a batch's positions count (and are checkpointed) only
        once it is written, so a resume re-reads at most the batches in flight."""
        pending: tuple[SourceBatch, asyncio.Future[Any]] | None = None
        async with contextlib.aclosing(source.read(dict(st.next), until, batch_size)) as batches:
            try:
                async for batch in _read_ahead(batches):
                    parsing = asyncio.ensure_future(parse(batch))
                    if pending is not None:
                        async for step in written(*pending, phase):
                            yield step
                    pending = (batch, parsing)
                if pending is not None:
                    async for step in written(*pending, phase):
                        yield step
                    pending = None
            finally:
                if pending is not None and not pending[1].done():
                    pending[1].cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await pending[1]
        for p, e in until.items():  # partitions with nothing (left) to read
            st.next[p] = max(st.next.get(p, 0), e)

    async def written(
        batch: SourceBatch, parsing: asyncio.Future[Any], phase: str
    ) -> AsyncGenerator[Progress, None]:
        nonlocal last_save, last_progress
        rows, dups = (await apply(batch, await parsing)) if batch.values else (0, 0)
        st.events_read += len(batch.values)
        for part, position in batch.next.items():
            st.next[part] = max(st.next.get(part, 0), position)
        st.rows_written += rows
        st.duplicates_skipped += dups
        t = now()
        st.elapsed_s = t - clock_base
        if t - last_save >= checkpoint_every_s:
            st.extra = sink.bookkeeping()
            await store.save(st)
            last_save = t
        if t - last_progress >= progress_every_s:
            last_progress = t
            yield _progress(st, "progress", phase)

    async with contextlib.aclosing(copy(dict(st.ends), "replay")) as steps:
        async for p in steps:
            yield p
    st.extra = sink.bookkeeping()
    await store.save(st)
    seal: Callable[[int], Awaitable[None]] | None = getattr(sink, "seal", None)
    if seal is not None:  # what the bulk load deferred, before the gate closes
        yield _progress(st, "progress", "seal")  # messages: postings, the vectors' carry and fill
        await seal(st.generation)
        st.elapsed_s = now() - clock_base
        yield _progress(st, "progress", "sealed")

    # Hand-over: the live projector waits at its gate while the gap is replayed and the
    # pointer moves, so no live write lands in the old generation after the switch.
    async with _maybe(gate):
        later = await source.ends()
        for part, end in later.items():
            st.ends[part] = max(st.ends.get(part, 0), end)
            st.starts.setdefault(part, 0)
        async with contextlib.aclosing(copy(dict(st.ends), "hand-over")) as steps:
            async for p in steps:
                yield p
        await sink.switch(st.generation)
        await store.finish(name, st.generation)
    if st.previous != st.generation:
        try:
            await sink.drop(st.previous)
        except Exception:  # the switch is done; an old table left behind is only disk
            log.exception("replay %s: dropping generation %d failed", name, st.previous)
    st.elapsed_s = now() - clock_base
    yield _progress(st, "report", "done")


async def _read_ahead(batches: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """``batches``, with the next one read while the caller applies the current one (the
    source's decoding overlaps the sink's write). One batch ahead at most."""
    pending: asyncio.Future[T | None] = asyncio.ensure_future(anext(batches, None))
    try:
        while (batch := await pending) is not None:
            pending = asyncio.ensure_future(anext(batches, None))
            yield batch
    finally:
        if not pending.done():
            pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pending


class _NoGate:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def _maybe(gate: Gate | None) -> Gate | _NoGate:
    return gate if gate is not None else _NoGate()
