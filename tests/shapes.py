"""Strict checks of message shapes against the ``openai`` and ``anthropic`` packages' own
request types (TypedDicts).

pydantic validates those TypedDicts leniently (extra keys ignored, ``Iterable`` fields checked
lazily), so this walks the type annotations itself: a value conforms to a TypedDict when every
required key is present, no unknown key is there, and every value conforms to its annotation.
"""

from __future__ import annotations

import collections.abc
import re
import types
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from typing_extensions import is_typeddict


def _errors(value: Any, tp: Any, where: str) -> list[str]:
    origin = get_origin(tp)
    if tp is Any or tp is object:
        return []
    if origin in (Required, NotRequired) or str(origin).endswith(("Required", "NotRequired")):
        return _errors(value, get_args(tp)[0], where)
    if origin in (Union, types.UnionType):
        options = [_errors(value, t, where) for t in get_args(tp)]
        if any(not o for o in options):
            return []
        return [f"{where}: matches no member of {tp}: {min(options, key=len)}"]
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{where}: {value!r} not in {get_args(tp)}"]
    if tp is type(None):
        return [] if value is None else [f"{where}: expected null"]
    if tp is str:
        return [] if isinstance(value, str) else [f"{where}: expected a string"]
    if tp is bool:
        return [] if isinstance(value, bool) else [f"{where}: expected a boolean"]
    if tp in (int, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected a number"]
    if origin in (collections.abc.Iterable, list, collections.abc.Sequence):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        (item,) = get_args(tp)
        return [e for i, v in enumerate(value) for e in _errors(v, item, f"{where}[{i}]")]
    if origin in (dict, collections.abc.Mapping):
        return [] if isinstance(value, dict) else [f"{where}: expected an object"]
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: expected an object ({tp.__name__})"]
        hints = get_type_hints(tp, include_extras=True)
        required = tp.__required_keys__
        errs = [f"{where}.{k}: missing" for k in required if k not in value]
        errs += [f"{where}.{k}: not a field of {tp.__name__}" for k in value if k not in hints]
        for k, v in value.items():
            if k in hints:
                errs += _errors(v, hints[k], f"{where}.{k}")
        return errs
    return [f"{where}: cannot check {tp!r}"]


def openai_errors(messages: object) -> list[str]:
    """Why ``messages`` would not type as ``Iterable[ChatCompletionMessageParam]`` ([] if ok)."""
    return _errors(messages, list[ChatCompletionMessageParam], "messages")


def anthropic_errors(messages: object) -> list[str]:
    """Why ``messages`` would not type as ``Iterable[anthropic.types.MessageParam]``."""
    return _errors(messages, list[MessageParam], "messages")


def openai_linkage_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Chat Completions' pairing rule: an assistant message with ``tool_calls`` is followed at
    once by one ``tool`` message for each of its ids, and a ``tool`` message answers an
    unanswered call of the assistant message just before its run of tool messages."""
    errs: list[str] = []
    pending: list[str] = []  # ids of the last call message not answered yet
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            tid = m.get("tool_call_id")
            if tid not in pending:
                errs.append(f"messages[{i}]: tool result for a call not just before it")
            else:
                pending.remove(tid)
            continue
        if pending:
            errs.append(f"messages[{i}]: calls {pending} have no tool message before it")
        pending = [tc["id"] for tc in m.get("tool_calls") or []]
    if pending:
        errs.append(f"messages[-1]: calls {pending} have no tool message")
    return errs


_ANTHROPIC_ID = re.compile(r"[A-Za-z0-9_-]+")


def anthropic_linkage_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Messages API's pairing rule: every ``tool_use`` of an assistant turn is answered by a
    ``tool_result`` in the very next user turn, which starts with its results (no text before
    them); a ``tool_result`` answers a ``tool_use`` of the turn just before; no text block
    is empty or whitespace; tool ids match ``^[a-zA-Z0-9_-]+$`` (what the API enforces)."""
    errs: list[str] = []
    pending: set[Any] = set()
    for i, turn in enumerate(messages):
        content = turn.get("content")
        blocks: list[dict[str, Any]] = (
            [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        )
        kinds = [b.get("type") for b in blocks]
        if any(b.get("type") == "text" and not str(b.get("text", "")).strip() for b in blocks):
            errs.append(f"messages[{i}]: text block without non-whitespace text")
        for b in blocks:
            tid = b.get("id") if b.get("type") == "tool_use" else b.get("tool_use_id")
            if b.get("type") in ("tool_use", "tool_result") and not _ANTHROPIC_ID.fullmatch(
                str(tid)
            ):
                errs.append(f"messages[{i}]: tool id {tid!r} is not ^[a-zA-Z0-9_-]+$")
        if any(
            b.get("type") == "tool_result" and "content" in b and not str(b["content"]).strip()
            for b in blocks
        ):
            errs.append(f"messages[{i}]: tool_result with whitespace-only content")
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        last_result = max((j for j, k in enumerate(kinds) if k == "tool_result"), default=-1)
        if last_result > 0 and "text" in kinds[:last_result]:
            errs.append(f"messages[{i}]: text before a tool_result")
        if turn.get("role") == "user":
            for rid in results:
                if rid not in pending:
                    errs.append(f"messages[{i}]: tool_result {rid} answers no tool_use just before")
            missing = pending - set(results)
            if missing:
                errs.append(f"messages[{i}]: tool_use {sorted(missing)} not answered")
            pending = set()
        else:
            if pending:
                errs.append(f"messages[{i}]: tool_use {sorted(pending)} not answered")
            pending = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
    if pending:
        errs.append(f"messages[-1]: tool_use {sorted(pending)} not answered")
    return errs
