"""The OpenAPI contract: how a route declares its models, and the document built from them.

A route declares its request body, its answer and its error statuses in one call::

    @router.post("/memory/store", **contract(body=wire.StoreBody, answer=wire.Stored))

``contract`` gives FastAPI ``response_model`` (documented only: the route still returns a
``JSONResponse`` rendered by orjson, so nothing is validated on the hot path), ``responses``
with :class:`~memstream.schemas.wire.ErrorBody` for each error status, and the request body
(the route keeps parsing it by hand, so a refusal is a 400 naming the exact field). Models
live in ``memstream.schemas.wire``.

:func:`install` replaces ``app.openapi``: it adds the body models to ``components``, drops
FastAPI's 422 (validation errors are answered 400 here, see ``errors.install``), and turns
the ``Authorization`` / ``X-Memstream-Admin-Token`` header parameters into security schemes
(``bearer``, ``adminToken``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from fastapi import FastAPI, Response
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from memstream.schemas.wire import ErrorBody

ERROR_TEXT: Final[dict[int, str]] = {
    400: "invalid_request: a refused field, named in error.field",
    401: "unauthorized: missing or unknown credentials",
    403: "forbidden, e.g. memory_not_bound",
    404: "not_found",
    409: "conflict, e.g. capacity_exceeded",
    413: "the body is too large",
    422: "content_too_long (a memstream rule, not a schema error)",
    500: "internal: an unexpected failure (logged with its traceback)",
    503: "a part this route needs is unavailable (journal_unavailable, not_ready...)",
}
DEFAULT_ERRORS: Final = (400, 401, 503)
_REF: Final = "#/components/schemas/{model}"
_BODIES: dict[str, type[BaseModel]] = {}
_HEADER_SCHEMES: Final = {
    "authorization": (
        "bearer",
        {"type": "http", "scheme": "bearer", "description": "an account API key"},
    ),
    "x-memstream-admin-token": (
        "adminToken",
        {"type": "apiKey", "in": "header", "name": "X-Memstream-Admin-Token"},
    ),
}


def contract(
    *,
    answer: type[BaseModel] | None = None,
    body: type[BaseModel] | None = None,
    errors: Iterable[int] = DEFAULT_ERRORS,
    body_required: bool = True,
    other: dict[int, type[BaseModel]] | None = None,
    media_type: str | None = None,
    query: Iterable[Query] = (),
) -> dict[str, Any]:
    """Keyword arguments for ``router.get/post/...``: the route's documented contract.
    ``errors`` answer :class:`ErrorBody`; ``other`` maps a status to another model;
    ``media_type`` documents a success answer that is not JSON (text, NDJSON) as a string;
    ``query`` documents the query parameters a route reads by hand."""
    responses: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": ERROR_TEXT.get(code, "error")} for code in errors
    }
    for code, model in (other or {}).items():
        responses[code] = {"model": model, "description": ERROR_TEXT.get(code, "answer")}
    out: dict[str, Any] = {"responses": responses}
    if answer is not None:
        out["response_model"] = answer
    if media_type is not None:
        out["response_class"] = _text_answer(media_type)
    extra: dict[str, Any] = {}
    params = [q.parameter() for q in query]
    if params:
        extra["parameters"] = params
    if body is not None:
        _BODIES[body.__name__] = body
        extra["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=body.__name__)}}},
        }
    if extra:
        out["openapi_extra"] = extra
    return out


@dataclass(frozen=True)
class Query:
    """A query parameter a route reads by hand (``request.query_params``), for the document."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})

    def parameter(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "in": "query",
            "required": False,
            "description": self.description,
            "schema": self.schema,
        }


def _text_answer(media_type: str) -> type[Response]:
    """A response class FastAPI documents as ``media_type`` (a string), not as JSON."""
    return type("TextAnswer", (Response,), {"media_type": media_type})


def _operations(doc: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for item in doc.get("paths", {}).values():
        for method, op in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield op


def build(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app`` (see the module docstring for what is adjusted)."""
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    models: list[type[BaseModel]] = [ErrorBody, *_BODIES.values()]
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas.update(defs.get("$defs", {}))
    error_ref = {
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}}
    }
    used_schemes: dict[str, Any] = {}
    for op in _operations(doc):
        responses = op.get("responses", {})
        refs_422 = str(responses.get("422", {}))
        if "HTTPValidationError" in refs_422:
            responses.pop("422")
        if not any(code.startswith(("4", "5")) for code in responses):  # undeclared: defaults
            for code in DEFAULT_ERRORS:
                responses[str(code)] = {"description": ERROR_TEXT[code], **error_ref}
        responses.setdefault("500", {"description": ERROR_TEXT[500], **error_ref})  # any route
        for code, answer in responses.items():
            if code.startswith(("4", "5")) and "ErrorBody" in str(answer.get("content")):
                answer.update(error_ref)  # JSON, also on a route whose success is text
        params = []
        for p in op.get("parameters", []):
            scheme = (
                _HEADER_SCHEMES.get(p.get("name", "").lower()) if p.get("in") == "header" else None
            )
            if scheme is None:
                params.append(p)
                continue
            name, spec = scheme
            used_schemes[name] = spec
            op.setdefault("security", []).append({name: []})
        if params:
            op["parameters"] = params
        else:
            op.pop("parameters", None)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    if used_schemes:
        components["securitySchemes"] = used_schemes
    return doc


def install(app: FastAPI) -> None:
    cache: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if "doc" not in cache:
            cache["doc"] = build(app)
        doc: dict[str, Any] = cache["doc"]
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
