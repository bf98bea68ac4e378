"""Reading request bodies by hand, so every error names the exact field (FastAPI's own
body models would report pydantic locations instead)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import orjson
from fastapi import Request

from memstream.agents_ctx.validation import check_json, exact_json
from memstream.errors import InvalidRequest

_LONG_DIGITS = re.compile(rb"[0-9]{19}")


async def read_json(request: Request) -> object:
    """The body as JSON (``None`` when empty); invalid JSON names the field ``body``, a
    NUL character, nesting past ``MAX_JSON_DEPTH`` or an integer beyond 64 bits (orjson
    would make it a float) names the field it is in."""
    raw = await request.body()
    if not raw:
        return None
    try:
        body: object = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"the body is not valid JSON: {e}", field="body") from None
    check_json(body, "")  # nesting limit, no NUL anywhere: the error names the field
    if _LONG_DIGITS.search(raw):  # orjson makes an integer beyond 64 bits a float: name it
        check_json(exact_json(raw), "")  # (nesting already bounded, for the stdlib parser)
    return body


async def read_object(request: Request) -> Mapping[str, object]:
    """The body as a JSON object; anything else names the field ``body``."""
    obj = await read_json(request)
    if not isinstance(obj, dict):
        raise InvalidRequest("the body must be a JSON object", field="body")
    return obj
