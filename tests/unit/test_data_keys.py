"""The sealed-record format and its rules (crypto-shredding, ``infra/data_keys.py``)."""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.infra.data_keys import (
    KID_BYTES,
    OVERHEAD_BYTES,
    SealError,
    is_sealed,
    key_id_of,
    memory_scope,
    open_sealed,
    seal,
    thread_scope,
    user_scope,
)
from memstream.schemas.events import Envelope, dead_letter, encode, message_appended
from memstream.schemas.records import Message
from memstream.streams.dlq import DeadLetter, _parse
from memstream.streams.journal_relay import plan_batch


def parsed(letter: Envelope) -> DeadLetter:
    """The dead letter as ``dlq`` reads it back off the topic."""
    out = _parse(encode(letter), 0, 0)
    assert out is not None
    return out


def test_seal_open_round_trip_hides_the_plaintext() -> None:
    aead, kid = AESGCM(AESGCM.generate_key(bit_length=256)), os.urandom(KID_BYTES)
    plain = b'{"type":"message.appended","data":{"content":"armadillo"}}'
    sealed = seal(aead, kid, plain)
    assert is_sealed(sealed) and not is_sealed(plain)
    assert key_id_of(sealed) == kid and len(sealed) == len(plain) + OVERHEAD_BYTES
    assert b"armadillo" not in sealed
    assert open_sealed(aead, sealed) == plain
    assert seal(aead, kid, plain) != sealed  # random nonces


def test_a_record_opens_only_with_its_key_and_untampered() -> None:
    aead, kid = AESGCM(AESGCM.generate_key(bit_length=256)), os.urandom(KID_BYTES)
    sealed = seal(aead, kid, b"hello")
    with pytest.raises(SealError):
        open_sealed(AESGCM(AESGCM.generate_key(bit_length=256)), sealed)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealError):
        open_sealed(aead, tampered)
    other_kid = sealed[:4] + os.urandom(KID_BYTES) + sealed[4 + KID_BYTES :]
    with pytest.raises(SealError):  # the key id is authenticated too
        open_sealed(aead, other_kid)


def test_scopes_are_unambiguous() -> None:
    assert thread_scope("a", "b/c", "d").text != thread_scope("a", "b", "c/d").text
    assert user_scope("a", "u").text != thread_scope("a", "", "u").text


def test_memory_events_are_sealed_by_their_user_only_when_they_carry_content() -> None:
    def event(user: object, content: str) -> dict[str, object]:
        return {"account_id": "acme", "data": {"entry": {"user_id": user, "content": content}}}

    assert memory_scope(event("alice", "likes tea")) == user_scope("acme", "alice")
    assert memory_scope(event("alice", "")) is None  # an erasure's content-free forgotten
    assert memory_scope(event(None, "shared fact")) is None  # no user: never erased
    assert memory_scope({"data": {}}) is None


def test_a_sealed_dead_letter_keeps_the_bytes_lossless_and_retry_restores_them() -> None:
    aead, kid = AESGCM(AESGCM.generate_key(bit_length=256)), os.urandom(KID_BYTES)
    sealed = seal(aead, kid, b"x" * 50)
    letter = dead_letter(
        raw=sealed, error="boom", processor="p", topic="t", partition=0, offset=1, key=None, ts=1
    )
    assert letter.data["payload_encoding"] == "base64" and letter.data["lossless"] is True
    assert base64.b64decode(str(letter.data["payload"])) == sealed
    assert parsed(letter).payload_bytes() == sealed  # what `dlq retry` sends
    plain = dead_letter(
        raw=b'{"a":1}', error="e", processor="p", topic="t", partition=0, offset=1, key=None, ts=1
    )
    assert "payload_encoding" not in plain.data and parsed(plain).payload_bytes() == b'{"a":1}'


def test_sealing_relay_quarantines_without_content() -> None:
    msg = Message("acme", "bot", "t1", 0, "m1", "user", "q" * 500 + " armadillo", datetime.now(UTC))
    raw = encode(message_appended(msg, 1))
    kept = plan_batch([(1, raw)], "j", 1, max_record_bytes=100)
    dropped = plan_batch([(1, raw)], "j", 1, max_record_bytes=100, keep_head=False)
    assert b"armadillo" in kept.poison[0][1]
    assert b"armadillo" not in dropped.poison[0][1] and dropped.oversized == (1,)
    ok = plan_batch([(1, raw)], "j", 1, keep_head=False)
    assert [e.thread_id for e in ok.envelopes] == ["t1"] and ok.records[0][1] == raw


def test_the_erasure_block_filter_finds_every_envelope_of_the_threads_and_skips_others() -> None:
    from memstream.infra.journal.codec import encode_seq_block
    from memstream.infra.journal.erase import redact_block, thread_filter
    from memstream.schemas.events import encode_message_appended

    def env(thread: str, content: str = "x") -> bytes:
        msg = Message("acme", "bot", thread, 0, f"m-{thread}", "user", content, datetime.now(UTC))
        return encode_message_appended(msg, 1, orjson.dumps(msg.to_dict()))

    odd = 'quote"d é t1'  # an id orjson escapes (the quote) and one it writes raw (é)
    erased = {("acme", "bot", "t1"), ("acme", "bot", odd)}
    candidates = thread_filter(erased)
    for thread in ("t1", odd):
        block = encode_seq_block([env("t2"), env(thread, "secret"), env("t10")])
        with_filter = redact_block(block, erased, candidates)
        assert with_filter is not None and with_filter == redact_block(block, erased)
        assert with_filter[1] == 1 and b"secret" not in with_filter[0]
    # a block naming the thread only in content, or a longer id, is not touched
    others = encode_seq_block([env("t10"), env("t2", 'the thread_id "t1"')])
    assert redact_block(others, erased, candidates) is None
    assert candidates.search(encode_seq_block([env("t10"), env("t11")])) is None
