"""One qdrant-edge shard on disk that can rebuild its HNSW graphs beside itself.

Shared by the memory index (``memory_index.edge``) and the transcript's vector index
(``messages.vector_index``): both keep their points in qdrant-edge shards in this process,
and both need graphs built without stopping the process. qdrant-edge's ``optimize()`` holds
the GIL for its whole build (measured: a Python thread spinning beside a 12 s build got no
time slice; an asyncio loop beside a 1.9 s build of 12k points ticked 0 times), so a build
in ``memstream up``'s process froze every request for its length: seconds at 10k memory
entries, ~30 s at 100k, minutes at 1M transcript vectors.

Layout: ``<path>/CURRENT`` names the shard folder in use (``g1``, ``g2``...). A folder made
by an earlier release (the shard's files directly in ``<path>``) is adopted as ``g1`` at the
first open (through ``<parent>/.adopt-<name>``, so a crash in the middle is finished at the
next open).

:meth:`ShardSlot.build`:

1. the shard in use is flushed and copied to the next ``g<N>`` (writes wait for the copy);
   from then on every write is also kept aside;
2. a child process (``python -m memstream.projections.edge_slot FOLDER``, nice 19) loads the
   copy and runs ``optimize()``, holding a GIL of its own;
3. the built copy is loaded here, the writes kept aside are applied to it, ``CURRENT`` is
   renamed over, and the copy is the shard in use; the old one is closed and deleted
   :data:`RETIRE_S` later, when no search can still be reading it.

A failed or killed child leaves the shard in use as it was (its copy deleted); folders of an
interrupted build are swept at the next open. Blocking methods run in worker threads.
Copies keep the shard's sparse files sparse (``infra/sparse_copy``): a copy writes what the
shard holds, not the ~200 MB qdrant-edge preallocates.

:meth:`ShardSlot.rewrite` (erasure) goes the same way, but its child writes a fresh shard
from the live points of the copy instead of optimizing the copy: a delete only marks a
point, whose vector, sparse terms and payload stay in its segment, and the WAL keeps the
operation that wrote them, until this rewrite (``docs/owning-memory.md``). Builds and
rewrites take turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    HnswIndexConfig,
    Modifier,
    Point,
    ScalarQuantizationConfig,
    ScalarType,
    ScrollRequest,
    UpdateOperation,
)

from memstream.infra.sparse_copy import copy_tree, sync_tree
from memstream.projections.memory_index.tuning import IndexTuning
from memstream.projections.shared_runs import SharedRuns

log = logging.getLogger(__name__)

CURRENT: Final = "CURRENT"
"""The file naming the shard folder in use."""
CONFIG_FILE: Final = "edge_config.json"
"""Where qdrant-edge keeps a shard's configuration, which ``EdgeShard.load`` reads."""
REWRITE_PAGE: Final = 1_000
"""Points a rewrite reads and writes at a time."""
RETIRE_S: Final = 30.0
"""How long a shard replaced by a build stays open for the searches still reading it."""

Write = Callable[[EdgeShard], None]


def shard_config(
    dimensions: int, tuning: IndexTuning, *, dense: str, sparse: str | None = None
) -> EdgeConfig:
    """A shard's configuration: a named dense (cosine) vector (with an int8 copy when
    ``tuning.quantization`` says so), optionally a named sparse one (BM25 with IDF), and the
    HNSW graph and indexing threshold of ``tuning``."""
    optimizers = (
        EdgeOptimizersConfig(indexing_threshold=tuning.indexing_threshold_kb)
        if tuning.indexing_threshold_kb is not None
        else None
    )
    return EdgeConfig(
        optimizers=optimizers,
        vectors={
            dense: EdgeVectorParams(
                size=dimensions,
                distance=Distance.Cosine,
                quantization_config=(
                    ScalarQuantizationConfig(ScalarType.Int8, quantile=0.99, always_ram=True)
                    if tuning.quantization == "int8"
                    else None
                ),
            )
        },
        sparse_vectors=(
            {sparse: EdgeSparseVectorParams(modifier=Modifier.Idf)} if sparse is not None else None
        ),
        hnsw_config=HnswIndexConfig(
            m=tuning.m,
            ef_construct=tuning.ef_construct,
            full_scan_threshold=tuning.full_scan_kb,
            payload_m=tuning.payload_m,
        ),
    )


class ShardSlot:
    """The shard at ``path`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._shard: EdgeShard | None = None
        self._generation = 0
        self._loaded = False
        self._lock = threading.Lock()  # loading, creating and switching the shard
        self._write_lock = threading.Lock()  # writes, and a build's copy and switch
        self._during_build: list[Write] | None = None
        self._rewrites: SharedRuns[bool] = SharedRuns()  # its lock: one build or rewrite
        self._retired: list[tuple[EdgeShard, Path]] = []

    @property
    def building(self) -> bool:
        return self._during_build is not None

    # --- the shard in use --------------------------------------------------------------------
    def get(self, config: EdgeConfig | None = None) -> EdgeShard | None:
        """The shard in use, loaded on first use (``config``: load it with this configuration
        instead of its stored one); None if there is none yet."""
        if self._loaded:
            return self._shard
        with self._lock:
            if not self._loaded:
                self._adopt()
                current = self.path / CURRENT
                if current.exists():
                    name = current.read_text().strip()
                    self._generation = int(name[1:])
                    folder = str(self.path / name)
                    self._shard = (
                        EdgeShard.load(folder) if config is None else EdgeShard.load(folder, config)
                    )
                    for stale in self.path.glob("g*"):
                        if stale.is_dir() and stale.name != name:
                            shutil.rmtree(stale, ignore_errors=True)
                self._loaded = True
            return self._shard

    def _adopt(self) -> None:
        """A folder of an earlier release (the shard directly in ``path``) becomes ``g1``."""
        parked = self.path.parent / f".adopt-{self.path.name}"
        if not parked.exists():
            if not self.path.is_dir() or (self.path / CURRENT).exists():
                return
            if not any(self.path.iterdir()):
                return
            self.path.rename(parked)
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / "g1").exists():
            parked.rename(self.path / "g1")
        else:
            shutil.rmtree(parked, ignore_errors=True)
        self._set_current(1)

    def create(
        self,
        config: EdgeConfig,
        setup: Sequence[UpdateOperation] = (),
        *,
        template: Path | None = None,
    ) -> EdgeShard:
        """The shard in use, created with ``config`` and the ``setup`` operations (payload
        indexes) if there is none.

        ``template``: a folder keyed by everything ``config`` and ``setup`` are made of. When
        it holds an empty shard made with them, the new shard is a copy of it (sparse,
        fsynced) instead of a create and one write per setup operation; when it does not,
        the shard is created, then copied there for the next one (see :func:`_keep_template`).
        """
        shard = self.get()
        if shard is not None:
            return shard
        with self._lock:
            if self._shard is None:
                folder = self.path / "g1"
                shutil.rmtree(folder, ignore_errors=True)
                shard = _from_template(template, folder) if template is not None else None
                if shard is None:
                    folder.mkdir(parents=True)
                    shard = EdgeShard.create(str(folder), config)
                    for op in setup:
                        shard.update(op)
                    shard.flush()
                    if template is not None:
                        _keep_template(folder, template)
                self._set_current(1)
                self._shard = shard
            return self._shard

    def reload(self, config: EdgeConfig) -> EdgeShard:
        """Close the shard in use and load it again with ``config`` (a new tuning)."""
        with self._write_lock, self._lock:
            if self._shard is not None:
                self._shard.flush()
                self._shard.close()
            folder = str(self.path / f"g{self._generation}")
            self._shard = EdgeShard.load(folder, config)
            return self._shard

    def _set_current(self, generation: int) -> None:
        tmp = self.path / f"{CURRENT}.tmp"
        tmp.write_text(f"g{generation}")
        tmp.replace(self.path / CURRENT)
        self._generation = generation

    def write(self, op: Write) -> None:
        """Apply ``op`` to the shard in use, and keep it for the one a build is making."""
        with self._write_lock:
            shard = self._shard
            if shard is None:
                raise RuntimeError(f"no shard at {self.path}")
            op(shard)
            if self._during_build is not None:
                self._during_build.append(op)

    # --- graphs ----------------------------------------------------------------------------
    def unindexed(self) -> int:
        """Points in no HNSW graph yet."""
        shard = self.get()
        if shard is None:
            return 0
        info = shard.info()
        return int(info.points_count) - int(info.indexed_vectors_count)

    def optimize_here(self) -> bool:
        """``optimize()`` in this process, holding the GIL throughout: benches and tests."""
        shard = self.get()
        return bool(shard.optimize()) if shard is not None else False

    async def build(self) -> bool:
        """Build the graphs in a child process and switch to the result (module docstring).
        False when there is no shard or a build or rewrite is already running."""
        jobs = self._rewrites.lock  # builds and rewrites take turns
        if jobs.locked():
            return False
        async with jobs:
            return await self._remake(rewrite=False)

    async def rewrite(self) -> bool:
        """Rewrite the shard in use into a fresh one that holds only its live points (for an
        erasure: a deleted point's vector, sparse terms and payload stay in its segment and
        in the WAL until then), with graphs built, in a child process, and switch to it;
        searches and writes go on meanwhile (module docstring). The replaced folder is
        deleted :data:`RETIRE_S` later. Waits for a build or rewrite already running; one
        that started after this call was made and succeeded covers it
        (:class:`~memstream.projections.shared_runs.SharedRuns`). False when there is no
        shard."""
        if await asyncio.to_thread(self.get) is None:
            return False
        done = await self._rewrites.run(lambda: self._remake(rewrite=True))
        return True if done is None else done

    async def _remake(self, *, rewrite: bool) -> bool:
        copied = await asyncio.to_thread(self._copy_for_build, rewrite)
        if copied is None:
            return False
        source, target = copied
        args = ["--rewrite", str(source), str(target)] if rewrite else [str(target)]
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                *args,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                _, err = await proc.communicate()
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
            if proc.returncode != 0:
                what = "rewrite" if rewrite else "graph build"
                raise RuntimeError(
                    f"{what} of {target} failed ({proc.returncode}): "
                    f"{err.decode(errors='replace')[-2000:]}"
                )
            await asyncio.to_thread(self._switch_to, target)
        except BaseException:
            with self._write_lock:
                self._during_build = None
            await asyncio.to_thread(shutil.rmtree, target, True)
            raise
        finally:
            if source != target:
                await asyncio.to_thread(shutil.rmtree, source, True)
        asyncio.get_running_loop().call_later(RETIRE_S, self._retire_later)
        return True

    def _copy_for_build(self, rewrite: bool = False) -> tuple[Path, Path] | None:
        """(the copy a child reads, the folder it leaves the result in): one folder for a
        build, which works on the copy in place; ``g<N+1>.src`` beside it for a rewrite."""
        shard = self.get()
        if shard is None:
            return None
        with self._write_lock:
            if self._during_build is not None:
                return None
            target = self.path / f"g{self._generation + 1}"
            source = target.with_name(f"{target.name}.src") if rewrite else target
            for folder in {target, source}:
                shutil.rmtree(folder, ignore_errors=True)
            shard.flush()
            copy_tree(self.path / f"g{self._generation}", source)
            self._during_build = []
        return source, target

    def _switch_to(self, target: Path) -> None:
        built = EdgeShard.load(str(target))
        with self._write_lock:
            for op in self._during_build or []:
                op(built)
            built.flush()
            self._during_build = None
            with self._lock:
                old, old_folder = self._shard, self.path / f"g{self._generation}"
                self._shard = built
                self._set_current(int(target.name[1:]))
            if old is not None:
                self._retired.append((old, old_folder))

    def _retire_later(self) -> None:
        threading.Thread(target=self.retire, name="edge-slot-retire", daemon=True).start()

    def retire(self) -> None:
        """Close and delete the shards builds replaced (blocking)."""
        with self._lock:
            retired, self._retired = self._retired, []
        for shard, folder in retired:
            with contextlib.suppress(Exception):
                shard.close()
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Flush and close the shard in use and the retired ones (blocking)."""
        with self._lock:
            if self._shard is not None:
                self._shard.flush()
                self._shard.close()
                self._shard = None
            self._loaded = False
        self.retire()


TEMPLATE_SHARD: Final = "shard"
"""The shard's folder inside a template folder (present only once wholly written)."""


def _from_template(template: Path, folder: Path) -> EdgeShard | None:
    """``template``'s empty shard copied to ``folder`` (a new one, durable) and loaded; None
    when there is no template yet or its copy failed (``folder`` is then removed). A
    template that does not load is removed too, so the next create keeps a good one."""
    source = template / TEMPLATE_SHARD
    if not source.is_dir():
        return None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        copy_tree(source, folder)
        sync_tree(folder)
        return EdgeShard.load(str(folder))
    except Exception as e:  # an OSError, or the engine refusing what was copied
        log.warning("could not use the empty shard at %s, creating one: %s", template, e)
        shutil.rmtree(folder, ignore_errors=True)
        if not isinstance(e, OSError):
            shutil.rmtree(template, ignore_errors=True)
        return None


def _keep_template(folder: Path, template: Path) -> None:
    """Copy the just-created, still empty shard at ``folder`` to ``template``: written to a
    folder of its own, fsynced, then renamed into place, so a template is whole or absent
    (a crash leaves a ``.tmp-*`` folder, swept by the next keep). Best effort: a failure is
    logged and the next create makes the shard again."""
    tmp = template.parent / f"{template.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        for stale in template.parent.glob(f"{template.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
        copy_tree(folder, tmp / TEMPLATE_SHARD)
        sync_tree(tmp)
        tmp.rename(template)
    except OSError as e:  # another process or thread was first, a full disk...
        if not (template / TEMPLATE_SHARD).is_dir():
            log.warning("could not keep an empty shard at %s: %s", template, e)
        shutil.rmtree(tmp, ignore_errors=True)


def _build_main(folder: str) -> None:
    """The child of :meth:`ShardSlot.build`: the graphs of the shard at ``folder``."""
    with contextlib.suppress(OSError):
        os.nice(19)
    shard = EdgeShard.load(folder)
    shard.optimize()
    shard.flush()
    shard.close()


def _rewrite_main(source: str, target: str) -> None:
    """The child of :meth:`ShardSlot.rewrite`: a fresh shard at ``target`` with the
    configuration (``edge_config.json``), payload indexes and live points of the one at
    ``source``, graphs built. Fresh, WAL included: the WAL of ``source`` still holds the
    operations that wrote deleted points."""
    with contextlib.suppress(OSError):
        os.nice(19)
    old = EdgeShard.load(source)
    Path(target).mkdir(parents=True)
    shutil.copyfile(Path(source) / CONFIG_FILE, Path(target) / CONFIG_FILE)
    new = EdgeShard.load(target)
    for name, info in old.info().payload_schema.items():  # before any point (graphs)
        schema = info.params if info.params is not None else info.data_type
        new.update(UpdateOperation.create_field_index(name, schema))
    offset = None
    while True:
        page = ScrollRequest(limit=REWRITE_PAGE, offset=offset, with_payload=True, with_vector=True)
        records, offset = old.scroll(page)
        if records:
            points = [Point(r.id, r.vector or {}, r.payload) for r in records]
            new.update(UpdateOperation.upsert_points(points))
        if offset is None:
            break
    old.close()
    new.optimize()
    new.flush()
    new.close()


if __name__ == "__main__":
    if sys.argv[1] == "--rewrite":
        _rewrite_main(sys.argv[2], sys.argv[3])
    else:
        _build_main(sys.argv[1])
