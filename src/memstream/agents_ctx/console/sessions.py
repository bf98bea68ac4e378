"""Console sessions: a random session id in an ``HttpOnly``, ``SameSite=Strict`` cookie,
held server-side with its CSRF token and expiry. Every state-changing request must carry
the session's CSRF token (a hidden form field or the ``X-CSRF-Token`` header htmx sends),
compared in constant time. Sessions live in the API process's memory: a restart logs
operators out, and with several API processes each keeps its own (log in per process).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

COOKIE = "memstream_console"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SESSION_TTL_S = 8 * 3600.0
MAX_SESSIONS = 1000


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    csrf: str
    expires: float


@dataclass
class Sessions:
    ttl_s: float = SESSION_TTL_S
    _by_id: dict[str, Session] = field(default_factory=dict)

    def open(self, now: float | None = None) -> Session:
        t = time.time() if now is None else now
        self._prune(t)
        s = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), t + self.ttl_s)
        self._by_id[s.sid] = s
        return s

    def get(self, sid: str | None, now: float | None = None) -> Session | None:
        if not sid:
            return None
        s = self._by_id.get(sid)
        t = time.time() if now is None else now
        if s is None or s.expires <= t:
            self._by_id.pop(sid, None)
            return None
        return s

    def close(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)

    def _prune(self, now: float) -> None:
        for sid in [k for k, s in self._by_id.items() if s.expires <= now]:
            del self._by_id[sid]
        while len(self._by_id) >= MAX_SESSIONS:  # oldest first (dicts keep insertion order)
            del self._by_id[next(iter(self._by_id))]


def csrf_ok(session: Session, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(session.csrf.encode(), (given or "").encode())


def credential_ok(expected: str, given: str) -> bool:
    """The admin credential check (constant time; an unset credential never matches)."""
    return bool(expected) and hmac.compare_digest(expected.encode(), given.encode())
