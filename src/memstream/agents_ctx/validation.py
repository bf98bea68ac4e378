"""Pure validation of what callers send: JSON bodies to records, errors naming the field.

Nothing here does I/O. Field paths use dots and brackets (``messages[2].tool_calls[0].id``)
so a caller can find the exact value that was refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import cast

import orjson

from memstream.agents_ctx.message_shapes import parse_tool_call, text_content, tool_call_name_field
from memstream.errors import InvalidRequest
from memstream.schemas.limits import (
    MAX_JSON_DEPTH,
    MAX_MESSAGE_CONTENT_CHARS,
    MAX_MESSAGES_PER_APPEND,
)
from memstream.schemas.records import ROLES, JSONValue, NewMessage, Role, ThreadConfig, ToolCall

ID_MAX_CHARS = 200
#: Ids are at most this many bytes of UTF-8 (so 32 emoji or 64 ``é`` at most).
ID_MAX_BYTES = 128


def check_id(value: object, field: str) -> str:
    """Ids (account, agent, thread, tool call, user): 1 to :data:`ID_MAX_BYTES` bytes of
    UTF-8, printable characters only, no ``/`` or ``\\``, no U+FFFD (a path's invalid
    UTF-8 decodes to it, so ``%FE`` and ``%FF`` would be one id), and not ``.`` or ``..``.
    Stores build keys from ids so that none can leave its prefix either
    (``infra.summary_store.key_segment``)."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field} must be a non-empty string", field=field)
    if len(value) > ID_MAX_CHARS:
        raise InvalidRequest(f"{field} must be at most {ID_MAX_CHARS} characters", field=field)
    if "/" in value or "\\" in value or not value.isprintable():
        raise InvalidRequest(
            f"{field} must not contain '/', '\\' or control characters", field=field
        )
    if value in (".", ".."):
        raise InvalidRequest(f"{field} must not be '.' or '..'", field=field)
    if "\ufffd" in value:  # what a path's invalid UTF-8 is decoded to: ids would collide
        raise InvalidRequest(
            f"{field} must be valid UTF-8 (it holds U+FFFD, which stands for bytes that are not)",
            field=field,
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRequest(f"{field} must be valid Unicode text", field=field) from None
    if size > ID_MAX_BYTES:
        raise InvalidRequest(
            f"{field} must be at most {ID_MAX_BYTES} bytes of UTF-8 (it has {size})", field=field
        )
    return value


def query_int(raw: str | None, field: str, default: int) -> int:
    """An integer query parameter: ``default`` when absent or empty, else ``int(raw)`` or
    ``InvalidRequest`` naming the field (never ``str.isdigit``, which also accepts ``"²"``,
    a character ``int`` refuses)."""
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"{field} must be an integer", field=field) from None


_FLAGS: dict[str, bool] = {"true": True, "1": True, "false": False, "0": False}


def check_flag(raw: str | None, field: str) -> bool:
    """A boolean query parameter: absent or empty is false; ``true``/``1``/``false``/``0``
    (any case); anything else is ``InvalidRequest`` naming the field."""
    if raw is None or raw == "":
        return False
    value = _FLAGS.get(raw.lower())
    if value is None:
        raise InvalidRequest(f"{field} must be true or false", field=field)
    return value


class WideInt(str):
    """An integer literal beyond 64 bits, as :func:`exact_json` reads it (orjson would have
    made it a float, silently changing the value)."""


def _int64(text: str) -> int | WideInt:
    digits = text.lstrip("-")
    if len(digits) > 20:
        return WideInt(text)
    value = int(text)
    return value if -(2**63) <= value < 2**64 else WideInt(text)


def exact_json(raw: bytes) -> object:
    """``raw`` parsed with every integer beyond 64 bits kept as a :class:`WideInt`, for
    :func:`check_json` to name. Slow (the standard library); for bodies that hold a run of
    19 or more digits only."""
    return json.loads(raw, parse_int=_int64)


def check_json(value: object, field: str, depth: int = 0) -> None:
    """A JSON value nests at most ``MAX_JSON_DEPTH`` deep, holds no NUL character in any
    string or key (Postgres refuses NUL in text; nothing downstream wants one) and no
    integer beyond 64 bits (:class:`WideInt`); else ``InvalidRequest`` naming the field."""
    if isinstance(value, WideInt):
        name = field or "body"
        raise InvalidRequest(
            f"{name} is an integer beyond 64 bits, which would lose its value: send it as a string",
            field=name,
        )
    if isinstance(value, str):
        if "\x00" in value:
            name = field or "body"
            raise InvalidRequest(f"{name} must not contain NUL characters", field=name)
        return
    if not isinstance(value, dict | list):
        return
    if depth >= MAX_JSON_DEPTH:
        raise InvalidRequest(f"{field} nests deeper than {MAX_JSON_DEPTH} levels", field=field)
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_json(v, f"{field}[{i}]", depth + 1)
        return
    for k, v in value.items():
        sub = f"{field}.{k}" if field else (str(k) or "body")
        if isinstance(k, str) and "\x00" in k:
            raise InvalidRequest(f"{field or 'body'} has a key with a NUL character", field=sub)
        check_json(v, sub, depth + 1)


def _check_arguments(arguments: object, field: str) -> None:
    """Tool-call ``arguments`` sent as JSON text are checked once parsed (depth, NUL)."""
    if isinstance(arguments, str) and arguments.strip()[:1] in ("{", "["):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return  # text that is not JSON is kept as a string (see message_shapes)
        check_json(parsed, field)


def _tool_calls(raw: object, where: str) -> tuple[ToolCall, ...]:
    """Tool calls in the OpenAI shape (``{"id", "type", "function": {"name", "arguments"}}``)
    or memstream's flat one (``{"id", "name", "arguments"}``): one record either way."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest(f"{where}tool_calls must be a list", field=f"{where}tool_calls")
    out = []
    for i, tc in enumerate(raw):
        f = f"{where}tool_calls[{i}]"
        if not isinstance(tc, Mapping):
            raise InvalidRequest(
                f"{f} must be an object with id and function (name, arguments)", field=f
            )
        id_, name, arguments = parse_tool_call(tc, f)
        _check_arguments(arguments, tool_call_name_field(tc, f).rsplit(".", 1)[0] + ".arguments")
        out.append(
            ToolCall(
                id=check_id(id_, f + ".id"),
                name=_nonempty_str(name, tool_call_name_field(tc, f)),
                arguments=arguments,
            )
        )
    ids = [tc.id for tc in out]
    if len(set(ids)) != len(ids):
        raise InvalidRequest("tool call ids must be unique", field=f"{where}tool_calls")
    return tuple(out)


def _nonempty_str(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{field} must be a non-empty string", field=field)
    return value


def parse_message(raw: object, where: str = "", user_id: str | None = None) -> NewMessage:
    """One message object → NewMessage. ``where`` prefixes field names (``messages[3].``)."""
    if not isinstance(raw, Mapping):
        raise InvalidRequest("a message must be a JSON object", field=where.rstrip(".") or "body")
    role = raw.get("role")
    if role == "developer":  # OpenAI's newer name for the system role
        role = "system"
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", field=f"{where}role")
    content = text_content(raw.get("content"), f"{where}content")
    if len(content) > MAX_MESSAGE_CONTENT_CHARS:
        raise InvalidRequest(
            f"content must be at most {MAX_MESSAGE_CONTENT_CHARS} characters",
            field=f"{where}content",
        )
    reasoning = raw.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise InvalidRequest("reasoning must be a string", field=f"{where}reasoning")
    tool_calls = _tool_calls(raw.get("tool_calls"), where)
    if tool_calls and role != "assistant":
        raise InvalidRequest("only assistant messages carry tool_calls", field=f"{where}tool_calls")
    tool_call_id = raw.get("tool_call_id")
    if role == "tool":
        tool_call_id = check_id(tool_call_id, f"{where}tool_call_id")
    elif tool_call_id is not None:
        raise InvalidRequest("only tool messages carry tool_call_id", field=f"{where}tool_call_id")
    if role in ("user", "system") and not content.strip():
        raise InvalidRequest(f"a {role} message needs non-empty content", field=f"{where}content")
    if role == "assistant" and not content.strip() and not tool_calls:
        raise InvalidRequest(
            "an assistant message needs content or tool_calls", field=f"{where}content"
        )
    return NewMessage(
        role=cast(Role, role),
        content=content,
        reasoning=reasoning,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        user_id=user_id,
    )


def parse_append_body(body: object, user_id: str | None) -> list[NewMessage]:
    """``{"role", "content", ...}`` or ``{"messages": [...]}`` → a non-empty list."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the body must be a JSON object", field="body")
    if "messages" in body:
        raw = body["messages"]
        if not isinstance(raw, list) or not raw:
            raise InvalidRequest("messages must be a non-empty list", field="messages")
        if len(raw) > MAX_MESSAGES_PER_APPEND:
            raise InvalidRequest(
                f"at most {MAX_MESSAGES_PER_APPEND} messages per append", field="messages"
            )
        return [parse_message(m, f"messages[{i}].", user_id) for i, m in enumerate(raw)]
    return [parse_message(body, "", user_id)]


def parse_thread_body(body: object) -> tuple[str | None, dict[str, JSONValue]]:
    """``{"thread_id"?, "metadata"?: {"config": {...}}}`` → (thread_id, metadata)."""
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise InvalidRequest("the body must be a JSON object", field="body")
    thread_id = body.get("thread_id")
    if thread_id is not None:
        thread_id = check_id(thread_id, "thread_id")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be an object", field="metadata")
    config = metadata.get("config")
    if config is not None and not isinstance(config, dict):
        raise InvalidRequest("metadata.config must be an object", field="metadata.config")
    ThreadConfig.from_dict(config)  # validates max_working_memory_messages
    return thread_id, cast(dict[str, JSONValue], metadata)
