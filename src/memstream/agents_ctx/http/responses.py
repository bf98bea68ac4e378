"""``JSONResponse``: orjson-rendered JSON (FastAPI deprecated its ORJSON response class).

It subclasses Starlette's ``JSONResponse`` so FastAPI documents a route's ``response_model``
under it (a plain ``Response`` subclass is documented as a string)."""

from __future__ import annotations

import orjson
from starlette.responses import JSONResponse as _StarletteJSON


class JSONResponse(_StarletteJSON):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
