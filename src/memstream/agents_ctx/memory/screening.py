"""Write-time screening of memory content: prompt injection and sensitive data.

Two different outcomes, as the spec says:

- **Prompt-injection patterns are rejected outright** (:func:`find_injection` names the
  pattern): "ignore previous instructions" and its paraphrases ("pay no attention to earlier
  instructions", "disregard what you were told", "from now on you must …", the common forms
  in French, Spanish, Portuguese, Italian, German and Dutch), "you are now …", a leading
  ``system:``, zero-width characters, right-to-left / bidi overrides, and curl/wget
  invocations carrying credentials (``-H"…"``, ``--header=…``, continued over lines with
  a backslash). Patterns cannot reach every paraphrase: a semantic screen follows them
  (:mod:`.semantic_screen`).
- **Credential and PII patterns are not rejected**: :func:`find_sensitive` names the kind
  (email, phone, card, ssn, api_key — cloud and service token shapes —, jwt, basic_auth —
  ``Authorization: Basic/Bearer …`` and passwords in URLs —, private_key, password) and the
  policy forces the entry
  to ``private`` — or rejects it when there is no user to make it private.

Pure: regular expressions over text, no I/O. The patterns aim at what an attacker or a
careless paste would actually contain while letting ordinary prose through ("please don't
ignore the instructions in the README", "system design", "user@localhost").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

SensitiveKind = Literal[
    "email", "phone", "card", "api_key", "jwt", "private_key", "password", "ssn", "basic_auth"
]

_I = re.IGNORECASE

# --- prompt injection ---------------------------------------------------------------------
_IGNORE_PREVIOUS = re.compile(
    r"\b(?=[idfos])(?:ignore|disregard|forget|override|skip)\s+"
    r"(?:(?:all|any|every|the|your|of|these|those|my)\s+){0,3}"
    r"(?:previous|prior|above|earlier|preceding|former|foregoing)\s+"
    r"(?:instructions?|rules?|prompts?|directions?|directives?|guidelines?|commands?)\b",
    _I,
)
# Paraphrased overrides: "from now on, pay no attention to earlier instructions", "disregard
# what you were told", "forget everything above", and the common forms in other languages.
_OVERRIDE_EN = re.compile(
    r"\b(?:pay\s+no\s+(?:attention|heed|mind)\s+to|do\s*n[o']?t\s+(?:follow|obey|listen\s+to)|"
    r"stop\s+following|throw\s+out|discard|abandon|ignore|disregard|forget|override|skip)\s+"
    r"(?:(?:all|any|every|the|your|of|these|those|my|what|everything|anything)\s+){0,3}"
    r"(?:(?:previous|prior|above|earlier|preceding|former|foregoing|original|initial|old|"
    r"existing|system|developer)\s+"
    r"(?:instructions?|rules?|prompts?|directions?|directives?|guidelines?|commands?)\b|"
    r"you\s+(?:were|have\s+been|'ve\s+been)\s+(?:told|given|instructed|taught)\b|"
    r"(?:was|has\s+been)\s+(?:said|written)\s+(?:above|before|earlier)\b|"
    r"(?:above|before|earlier)(?=\s*(?:[,.;:!]|and\b|$)))",
    _I,
)
_FROM_NOW_ON = re.compile(
    r"\b(?:from\s+now\s+on|henceforth|starting\s+now|new\s+instructions?\s*:)"
    r"[^.\n]{0,80}?\b(?:you\s+(?:must|will|should|are\s+to)|ignore|disregard|forget|"
    r"act\s+as|pretend|respond\s+only|always\s+(?:answer|reply|say)|never\s+(?:refuse|mention))",
    _I,
)
_OVERRIDE_OTHER = re.compile(
    # fr / es / pt / it / de / nl: "ignore(z) les instructions précédentes", "ignora las
    # instrucciones anteriores", "ignoriere alle vorherigen Anweisungen", ...
    r"\b(?:ignorez|ignorer|ignore(?=\s+(?:les|toutes|tous|as|todas|todos)\b)|ignora[rd]?|"
    r"ignorate|ignoriere|ignorieren|oubliez|oublie|olvida[rd]?|esque[cç]a|dimentica|vergiss|"
    r"vergessen\s+sie|negeer|vergeet)\b[^.\n]{0,40}?"
    r"\b(?:instructions?|consignes|instrucciones|instruções|instrucoes|istruzioni|"
    r"anweisungen|anweisung|instructies|regeln|reglas|règles|regras|regole)\b",
    _I,
)
_YOU_ARE_NOW = re.compile(r"\byou(?:\s+are|\s*['\u2019]re)\s+now\b(?=\s*\S)", _I)
_LEADING_SYSTEM = re.compile(r"\A\s*system\s*:", _I)
_ZERO_WIDTH = re.compile("[\u200b-\u200d\u2060\ufeff]")
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
_AUTH_HEADER_NAME = (
    r"(?:proxy-)?authorization|x-api-key|api-key|apikey|x-auth-token|x-access-token|"
    r"private-token|cookie"
)
_CURL_AUTH = re.compile(
    r"\b(?:curl|wget)\b[^\n]*?"
    r"(?:"
    rf"(?:\s-H|\s--header)(?:\s*=\s*|\s*)['\"]?\s*(?:{_AUTH_HEADER_NAME})\s*:"
    r"|\s-u\s*['\"]?[^\s:'\"]+:"
    r"|\s--(?:user|http-user|http-password|password|proxy-user|oauth2-bearer)\b"
    r")",
    _I,
)

INJECTION_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("ignore_previous_instructions", _IGNORE_PREVIOUS),
    ("instruction_override", _OVERRIDE_EN),
    ("from_now_on_override", _FROM_NOW_ON),
    ("instruction_override_translated", _OVERRIDE_OTHER),
    ("you_are_now", _YOU_ARE_NOW),
    ("leading_system_role", _LEADING_SYSTEM),
    ("zero_width_character", _ZERO_WIDTH),
    ("bidi_override", _BIDI),
    ("curl_with_credentials", _CURL_AUTH),
)
"""Every injection pattern, by name. Any match rejects the write."""


# A shell command continued over lines (``\`` then a line break) is one command.
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n[ \t]*")


def find_injection(text: str) -> str | None:
    """The name of the first injection pattern ``text`` matches, or None if it is clean."""
    joined = _CONTINUATION.sub(" ", text) if "\\" in text else text
    for name, pattern in INJECTION_PATTERNS:
        if pattern.search(joined):
            return name
    return None


# --- credentials and PII ------------------------------------------------------------------
_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}\b"
)
# International (+CC ...) or North-American (NXX) NXX-XXXX, each with separators; the digit
# count is checked afterwards (7..15, E.164).
_PHONE = re.compile(
    r"(?<![\w+])(?:"
    r"\+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]?\d{2,4}){1,4}"
    r"|\(\d{3}\)\s?\d{3}[\s.-]\d{4}"
    r"|\d{3}[.-]\d{3}[.-]\d{4}"
    r")(?![\w])"
)
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
# The lookahead lets the engine skip most positions before trying the alternation.
_API_KEY = re.compile(
    r"\b(?=[srgAxnhSpdA])(?:"
    r"sk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{16,}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|npm_[A-Za-z0-9]{36}"
    r"|sk-ant-[A-Za-z0-9_-]{16,}"
    r"|hf_[A-Za-z0-9]{30,}"
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"
    r"|pypi-[A-Za-z0-9_-]{50,}"
    r"|shpat_[a-fA-F0-9]{32}"
    r"|dop_v1_[a-f0-9]{64}"
    r"|AccountKey=[A-Za-z0-9+/]{40,}={0,2}"
    r")"
)
# Cloud credentials by their label (AWS secret access keys have no prefix of their own).
_LABELLED_SECRET = re.compile(
    r"\b(?:aws_secret_access_key|aws_session_token|secret_access_key)\s*[:=]\s*['\"]?"
    r"[A-Za-z0-9/+=]{30,}",
    _I,
)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-\d"
)
# US social security numbers (AAA-GG-SSSS; area 000, 666 and 9xx and group/serial 0 are
# never issued) and "SSN"-labelled nine-digit numbers.
_SSN = re.compile(
    r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])"
    r"|\b(?:ssn|social\s+security(?:\s+number)?)\W{0,3}(?:is\s+|no\.?\s*|number\s+)?\d{9}\b",
    _I,
)
_BASIC_AUTH = re.compile(
    r"\b(?:authorization\s*:\s*)?basic\s+[A-Za-z0-9+/]{8,}={0,2}(?![A-Za-z0-9+/=])"
    r"|\bauthorization\s*:\s*(?:bearer|token|digest)\s+\S{8,}"
    r"|\b[a-z][a-z0-9+.-]*://[^\s:/@]+:[^\s:/@]{3,}@",
    _I,
)
_PASSWORD = re.compile(
    r"\b(?=[pPsSaAcC])(?:password|passwd|pwd|passphrase|pass|secret|api[_-]?key|access[_-]?token|"
    r"auth[_-]?token|client[_-]?secret)\s*[:=]\s*['\"]?[^\s'\"]{3,}"
    r"|\b(?=[mMtThHoOyY])(?:my|the|his|her|their|our|your)\s+(?:password|passphrase|pin)\s+(?:is|was)\s+\S{3,}",
    _I,
)


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a digit string (payment card numbers)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _has_card(text: str) -> bool:
    for m in _CARD.finditer(text):
        digits = re.sub(r"[ -]", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_ok(digits) and len(set(digits)) > 1:
            return True
    return False


def _has_phone(text: str) -> bool:
    for m in _PHONE.finditer(text):
        n = sum(c.isdigit() for c in m.group())
        if 7 <= n <= 15:
            return True
    return False


def find_sensitive(text: str) -> SensitiveKind | None:
    """The first kind of credential or personal data ``text`` carries, or None.

    Order matters only for the name reported: secrets first (they are the worst to leak).
    """
    if _PRIVATE_KEY.search(text):
        return "private_key"
    if _API_KEY.search(text) or _LABELLED_SECRET.search(text):
        return "api_key"
    if _BASIC_AUTH.search(text):
        return "basic_auth"
    if _JWT.search(text):
        return "jwt"
    if _PASSWORD.search(text):
        return "password"
    if _EMAIL.search(text):
        return "email"
    if _SSN.search(text):
        return "ssn"
    if _has_card(text):
        return "card"
    if _has_phone(text):
        return "phone"
    return None


@dataclass(frozen=True, slots=True)
class Screening:
    """What screening found: an injection pattern name (reject) and/or a sensitive kind."""

    injection: str | None
    sensitive: SensitiveKind | None


def screen(text: str) -> Screening:
    """Screen one piece of text for both outcomes."""
    return Screening(injection=find_injection(text), sensitive=find_sensitive(text))
