"""``hot_routes.match``: which requests skip FastAPI's routing (the rest must reach it)."""

from __future__ import annotations

import pytest

from memstream.agents_ctx.http.hot_routes import match


def test_the_two_per_turn_routes_match_with_their_ids() -> None:
    assert match("POST", "/v1/agents/bot/threads/t1/messages") == ("bot", "t1", "messages")
    assert match("GET", "/v1/agents/bot/threads/t1/context") == ("bot", "t1", "context")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/agents/bot/threads/t1/messages"),  # wrong method: FastAPI answers 405
        ("POST", "/v1/agents/bot/threads/t1/context"),
        ("HEAD", "/v1/agents/bot/threads/t1/context"),
        ("POST", "/v1/agents/bot/threads/t1/messages/"),  # trailing slash
        ("POST", "/v1/agents//threads/t1/messages"),  # empty agent id
        ("POST", "/v1/agents/bot/threads//messages"),  # empty thread id
        ("POST", "/v1/agents/bot/threads"),
        ("POST", "/v1/agents/bot/threads/t1/erase"),
        ("POST", "/v2/agents/bot/threads/t1/messages"),
        ("POST", "v1/agents/bot/threads/t1/messages/x"),
        ("GET", "/healthz"),
    ],
)
def test_anything_else_goes_to_fastapi(method: str, path: str) -> None:
    assert match(method, path) is None
