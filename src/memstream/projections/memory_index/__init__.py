"""The Qdrant memory index: layout (``layout``), pure event rules (``rules``), the backend
port (``port``), its two adapters (``edge``: qdrant-edge in-process, the embedded default;
``client``: qdrant-client, the server path) and the index service (``index``)."""

from memstream.projections.memory_index.index import MemoryIndex
from memstream.projections.memory_index.layout import (
    PointIdentity,
    RecallScope,
    collection_name,
    point_id,
)
from memstream.projections.memory_index.port import IndexBackend, IndexPoint, SparseVec
from memstream.projections.memory_index.rules import Delete, IndexOp, Upsert, op_for_event

__all__ = [
    "Delete",
    "IndexBackend",
    "IndexOp",
    "IndexPoint",
    "MemoryIndex",
    "PointIdentity",
    "RecallScope",
    "SparseVec",
    "Upsert",
    "collection_name",
    "op_for_event",
    "point_id",
]
