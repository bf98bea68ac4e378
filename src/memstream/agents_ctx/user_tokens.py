"""Signed end-user tokens: ``mst_<payload>.<signature>``, HMAC-SHA256 over the payload.

The payload is base64url JSON ``{"a": account, "u": user, "exp": unix seconds}``; the key
is the account's own random secret (Postgres, created on first mint). A token is minted by
the operator (``memstream keys user-token ACCOUNT USER [--ttl]``) or by the application's
backend, and handed to a browser or a less trusted service, which sends it as
``X-Memstream-User-Token`` (with the account key) or alone as ``Authorization: Bearer
mst_...`` (without the account key): either way it can act for that one user only, until it
expires. An account setting (``require_user_tokens``) then refuses the bare
``X-Memstream-User`` header and user-less calls.

Pure: no I/O; the clock and the secret are arguments.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Final

import orjson

from memstream.errors import Unauthorized

PREFIX: Final = "mst_"
DEFAULT_TTL_S: Final = 3600
MAX_TTL_S: Final = 30 * 24 * 3600


@dataclass(frozen=True, slots=True)
class UserToken:
    account_id: str
    user_id: str
    expires_at: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, payload.encode("ascii"), hashlib.sha256).digest())


def mint(secret: bytes, account_id: str, user_id: str, ttl_s: int, now: float | None = None) -> str:
    """A token for ``user_id`` of ``account_id``, valid ``ttl_s`` seconds."""
    if not 1 <= ttl_s <= MAX_TTL_S:
        raise ValueError(f"ttl must be between 1 and {MAX_TTL_S} seconds")
    exp = int((time.time() if now is None else now) + ttl_s)
    payload = _b64(orjson.dumps({"a": account_id, "u": user_id, "exp": exp}))
    return f"{PREFIX}{payload}.{_sign(secret, payload)}"


def account_of(token: str) -> str:
    """The account a token claims (unverified: only to find its secret)."""
    return _claims(token)[0]["a"]


def _claims(token: str) -> tuple[dict[str, str], str, str]:
    bad = Unauthorized("malformed user token", field="X-Memstream-User-Token")
    if not token.startswith(PREFIX) or token.count(".") != 1:
        raise bad
    payload, sig = token[len(PREFIX) :].split(".")
    try:
        claims = orjson.loads(_unb64(payload))
    except (ValueError, orjson.JSONDecodeError):
        raise bad from None
    if (
        not isinstance(claims, dict)
        or not isinstance(claims.get("a"), str)
        or not isinstance(claims.get("u"), str)
        or not isinstance(claims.get("exp"), int)
    ):
        raise bad
    return claims, payload, sig


def verify(secret: bytes, token: str, now: float | None = None) -> UserToken:
    """The token's claims if its signature is the account's and it has not expired;
    :class:`Unauthorized` (naming the header) otherwise."""
    claims, payload, sig = _claims(token)
    if not hmac.compare_digest(_sign(secret, payload), sig):
        raise Unauthorized(
            "the user token's signature is not valid", field="X-Memstream-User-Token"
        )
    exp = int(claims["exp"])
    if exp <= (time.time() if now is None else now):
        raise Unauthorized("the user token has expired", field="X-Memstream-User-Token")
    return UserToken(str(claims["a"]), str(claims["u"]), exp)
