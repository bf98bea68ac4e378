"""Wire shapes of conversation messages: what model APIs accept, in and out. Pure, no I/O.

One internal record (:class:`~memstream.schemas.records.Message`, tool calls as
``ToolCall(id, name, arguments)``) and the shapes agents already hold:

- **In** (``parse_tool_call`` / ``text_content``): OpenAI Chat Completions tool calls
  ``{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}`` and
  memstream's flat ``{"id", "name", "arguments"}``; ``content`` as a string, ``null``, or a
  list of ``{"type": "text", "text"}`` parts (joined with newlines).
- **Out, OpenAI** (:func:`openai_message`, the default): ``chat.completions.create`` accepts
  the messages unchanged. Tool-call ``arguments`` are JSON text (a stored string is passed
  through verbatim, anything else is serialized); an assistant message with tool calls and
  no text has ``content: null``.
- **Out, Anthropic** (:func:`anthropic_messages`, ``?format=anthropic``): the system
  messages joined apart as ``system`` text; assistant text and ``tool_use`` blocks; tool
  results as ``tool_result`` blocks in a user turn; consecutive same-role turns merged; no
  whitespace-only text block; tool-call ids mapped to the characters that API accepts
  (:func:`anthropic_tool_id`).

:func:`pair_tool_results` makes a window one both APIs accept: every call answered, its
results right after it, no result without its call (the window edge, a crash between a call
and its result, and a user message sent while a tool ran all break that pairing).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal, Protocol, TypeVar, cast, get_args

import orjson

from memstream.errors import InvalidRequest
from memstream.schemas.records import JSONObject, JSONValue, Role, ToolCall

Format = Literal["openai", "anthropic"]
FORMATS: Final[tuple[str, ...]] = get_args(Format)
PART_SEPARATOR: Final = "\n"


class ShapedMessage(Protocol):
    @property
    def role(self) -> Role: ...
    @property
    def content(self) -> str: ...
    @property
    def tool_calls(self) -> tuple[ToolCall, ...]: ...
    @property
    def tool_call_id(self) -> str | None: ...


M = TypeVar("M", bound=ShapedMessage)


# --- in ----------------------------------------------------------------------------------------
def text_content(raw: object, field: str) -> str:
    """``content`` as a string: a string, ``null`` (empty), or a list of text parts."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise InvalidRequest(f"{field} must be a string or a list of text parts", field=field)
    texts: list[str] = []
    for i, part in enumerate(raw):
        f = f"{field}[{i}]"
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise InvalidRequest(f'{f} must be a {{"type": "text", "text"}} part', field=f)
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{f}.text must be a string", field=f"{f}.text")
        texts.append(text)
    return PART_SEPARATOR.join(texts)


def parse_tool_call(raw: Mapping[str, object], field: str) -> tuple[object, object, JSONValue]:
    """``(id, name, arguments)`` of one tool call in either shape (unchecked id and name;
    the caller checks them so the field names match the shape that was sent)."""
    fn = raw.get("function")
    if fn is None:
        return raw.get("id"), raw.get("name"), cast(JSONValue, raw.get("arguments"))
    if not isinstance(fn, Mapping):
        raise InvalidRequest(f"{field}.function must be an object", field=f"{field}.function")
    kind = raw.get("type", "function")
    if kind != "function":
        raise InvalidRequest(f'{field}.type must be "function"', field=f"{field}.type")
    return raw.get("id"), fn.get("name"), cast(JSONValue, fn.get("arguments"))


def tool_call_name_field(raw: Mapping[str, object], field: str) -> str:
    """Where the name of this tool call lives in the shape that was sent."""
    return f"{field}.function.name" if "function" in raw else f"{field}.name"


# --- out: OpenAI ---------------------------------------------------------------------------------
def arguments_text(arguments: JSONValue) -> str:
    """Tool-call arguments as the JSON text OpenAI expects (a stored string verbatim)."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return "{}"
    return orjson.dumps(arguments).decode()


def openai_tool_call(tc: ToolCall) -> JSONObject:
    return {
        "id": tc.id,
        "type": "function",
        "function": {"name": tc.name, "arguments": arguments_text(tc.arguments)},
    }


def openai_message(m: ShapedMessage) -> JSONObject:
    """One message in the Chat Completions shape."""
    if m.tool_calls:
        return {
            "role": m.role,
            "content": m.content or None,
            "tool_calls": [openai_tool_call(tc) for tc in m.tool_calls],
        }
    out: JSONObject = {"role": m.role, "content": m.content}
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


# --- out: Anthropic ------------------------------------------------------------------------------
def tool_input(arguments: JSONValue) -> JSONObject:
    """``tool_use.input`` must be an object: JSON text is parsed; a non-object value is
    wrapped as ``{"arguments": value}`` (text that is not JSON stays a string there)."""
    value: object = arguments
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            value = arguments
    if value is None:
        return {}
    if isinstance(value, dict):
        return cast(JSONObject, value)
    return {"arguments": cast(JSONValue, value)}


_TOOL_ID_OK: Final = re.compile(r"[A-Za-z0-9_-]+")


def anthropic_tool_id(raw: str | None) -> str:
    """A tool-call id as Anthropic accepts it (``^[a-zA-Z0-9_-]+$``). Ids some providers emit
    (``functions.search:0``) or a user typed (``c 1``, ``ça``) are refused there with a 400,
    so any other character becomes ``_`` and a hash of the whole id is added, keeping two
    ids that differ only there apart. The same id always maps to the same one (call and
    result stay paired); a valid id is kept as it is."""
    value = raw or ""
    if _TOOL_ID_OK.fullmatch(value):
        return value
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return re.sub(r"[^A-Za-z0-9_-]", "_", value)[:48] + "_" + digest


def _blocks(m: ShapedMessage) -> list[JSONValue]:
    if m.role == "tool":
        result: JSONObject = {
            "type": "tool_result",
            "tool_use_id": anthropic_tool_id(m.tool_call_id),
        }
        if m.content.strip():  # the API refuses a whitespace-only text; content is optional
            result["content"] = m.content
        return [result]
    blocks: list[JSONValue] = []
    if m.content.strip():  # "text content blocks must contain non-whitespace text"
        blocks.append({"type": "text", "text": m.content})
    for tc in m.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": anthropic_tool_id(tc.id),
                "name": tc.name,
                "input": tool_input(tc.arguments),
            }
        )
    return blocks


def anthropic_messages(messages: Sequence[ShapedMessage]) -> tuple[str, list[JSONObject]]:
    """``(system, messages)`` for the Anthropic Messages API. System messages (the pinned
    facts, the summary, any in the window) become the system text, in order, separated by
    blank lines; the rest alternate ``user`` / ``assistant`` with content blocks."""
    system: list[str] = []
    out: list[JSONObject] = []
    for m in messages:
        if m.role == "system":
            system.append(m.content)
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            cast(list[JSONValue], out[-1]["content"]).extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


# --- tool calls and their results ---------------------------------------------------------------
def pair_tool_results(
    window: Sequence[M], with_calls: Callable[[M, tuple[ToolCall, ...]], M]
) -> list[M]:
    """The window as both model APIs accept it: every tool call answered, right after it.

    OpenAI and Anthropic refuse (400) a tool result with no call before it, a call with no
    result, and anything between a call and its results. A window can hold all three: its
    edge cuts a call off from its results, a runtime can crash between the call and the
    result, a user message can land while a tool runs. So:

    - each call's result is moved to right after the message that made the call (the
      first result for that id after the call; a second result, or a second call with an
      id already paired, is dropped: ids are unique in a request);
    - a result with no call before it in the window is dropped (the window edge cut it off);
    - a call with no result after it is taken out of its message (``with_calls`` makes the
      message with the calls left), and a message left with neither text nor calls is
      dropped.

    Nothing else moves, and nothing is added: the window only ever gets smaller.
    """
    results: dict[str, list[int]] = {}
    for i, m in enumerate(window):
        if m.role == "tool" and m.tool_call_id is not None:
            results.setdefault(m.tool_call_id, []).append(i)
    out: list[M] = []
    called: set[str] = set()  # ids paired already: an id is used once (Anthropic's rule)
    for i, m in enumerate(window):
        if m.role == "tool":
            continue  # placed right after its call, or dropped
        if not m.tool_calls:
            out.append(m)
            continue
        calls: list[ToolCall] = []
        answers: list[int] = []
        for tc in m.tool_calls:
            at = next((j for j in results.get(tc.id, ()) if j > i), None)
            if at is not None and tc.id not in called:
                called.add(tc.id)
                calls.append(tc)
                answers.append(at)
        if len(calls) == len(m.tool_calls):
            out.append(m)
        elif calls or m.content:
            out.append(with_calls(m, tuple(calls)))
        out.extend(window[j] for j in answers)
    return out


def check_format(raw: str | None) -> Format:
    if raw is None or raw == "":
        return "openai"
    if raw not in FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}", field="format")
    return cast(Format, raw)
