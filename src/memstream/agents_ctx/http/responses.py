"""``JSONResponse``: orjson-rendered JSON (FastAPI deprecated its ORJSON response class)."""

from __future__ import annotations

import orjson
from starlette.responses import Response


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
