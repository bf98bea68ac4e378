"""The embedding cache's file after an erasure: the forgotten vectors' bytes are in neither
the SQLite file nor its write-ahead log (a delete alone leaves them in a free page, and the
log keeps older copies of the page), while the other vectors are still read back."""

from __future__ import annotations

from array import array
from pathlib import Path

from memstream.infra.embeddings import SqliteEmbeddingStore
from tests.fixtures.disk import files_holding


def test_forgotten_vectors_leave_the_file_and_its_log(tmp_path: Path) -> None:
    store = SqliteEmbeddingStore(tmp_path / "emb.db")
    kept = [(f"k{i}", [float(i) + 0.25] * 8) for i in range(200)]
    secret = [1234.5678, -8765.4321, 0.0123, 42.4242, 3.1416, 2.7182, 1.4142, 9.8765]
    store.put_many("m", "passage", [*kept[:100], ("gone", secret), *kept[100:]])
    needle = array("f", secret).tobytes()
    assert files_holding(needle, tmp_path)  # the check sees what is there
    assert store.delete_many(["gone"]) == 1
    assert files_holding(needle, tmp_path) == []
    assert store.get_many("m", "passage", ["k7", "gone"]) == {"k7": [7.25] * 8}
    assert store.count() == 200
    store.close()
