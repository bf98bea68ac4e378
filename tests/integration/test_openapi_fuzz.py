"""Contract fuzzing (schemathesis) of every route ``memstream up`` documents in its
``/openapi.json``, with an admin key, an ordinary key and no key.

For every operation of the document, a fixed number of cases (derandomized, in a process
with a fixed hash seed: the same cases every run) are drawn from four strategies: schema-valid and schema-violating
requests, each with random path parameters and with ones naming data that exists (a
bound agent, a thread with messages, a stored entry). Each case is sent three times,
once per caller. Every answer must be no 5xx, have a documented status and content type,
validate against the documented schema, and a 400 must name its field. After the run the
server still answers, and SIGTERM stops it.

Bounded: about a minute of fuzzing on a loaded 2-core box (``EXAMPLES`` cases per
operation); the start of ``memstream up`` comes on top.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis.strategies as st
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from memstream.infra.accounts import Accounts
from memstream.infra.cli.state import read_state
from memstream.infra.postgres import create_pool

KEY = "fuzz-key-123"
#: cases per operation; raise it for a deeper run (MEMSTREAM_FUZZ_EXAMPLES=200 pytest ...)
EXAMPLES = int(os.environ.get("MEMSTREAM_FUZZ_EXAMPLES", "8"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
#: path parameters that name existing data (seeded before the run)
KNOWN = {
    "agent_id": "fuzz-bot",
    "thread_id": "t1",
    "key": "lang",
    "tool_call_id": "call-1",
    "user_id": "bob",
}
#: operations the admin token is not sent to: a rebuild per case would be the whole run
NO_ADMIN_TOKEN = {("POST", "/admin/replay/{projection}")}


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx: Any, value: Any) -> bytes:
    """The import body is documented as a string (NDJSON text): send it as it is."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    # a schema-violating body may be anything: big integers, non-string keys, NaN
    lines = value if isinstance(value, list) else [value]
    return b"\n".join(json.dumps(v, default=str).encode() for v in lines)


def _start_up(data: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "MEMSTREAM_API_KEYS": f"acme:{KEY}"}
    with log.open("wb") as out:  # a file, not a pipe: nobody has to keep reading it
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstream.infra.cli.main", "up", "--data-dir", str(data),
             "--port", "0", "--no-access-log"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("memstream ready at "):
                return proc, line.split(" at ", 1)[1].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    proc.kill()
    proc.wait()
    raise AssertionError("memstream up never got ready:\n" + log.read_text()[-4000:])


@pytest.fixture
def up(traversable_tmp: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    data = traversable_tmp / "fuzz-up"
    proc, url = _start_up(data, tmp_path / "up.log")
    try:
        yield url, data
        # still answering after the fuzz, and SIGTERM stops it within a bound
        assert httpx.get(f"{url}/livez", timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, (tmp_path / "up.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _seed(url: str) -> None:
    h = {"Authorization": f"Bearer {KEY}", "X-Memstream-User": "alice"}
    with httpx.Client(base_url=url, headers=h, timeout=60) as c:
        a = f"/v1/agents/{KNOWN['agent_id']}"
        assert c.put(a, json={"memory": True}).status_code == 200
        messages = [
            {"role": "user", "content": "I prefer Rust for services."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call-1", "type": "function",
                 "function": {"name": "lookup", "arguments": '{"q": "rust"}'}}]},
            {"role": "tool", "tool_call_id": "call-1", "content": "Rust 1.90"},
        ]  # fmt: skip
        r = c.post(f"{a}/threads/t1/messages", json={"messages": messages})
        assert r.status_code == 201, r.text
        r = c.post(
            f"{a}/memory/store",
            json={"key": "lang", "content": "prefers Rust", "category": "user_profile",
                  "scope": "shared"},
        )  # fmt: skip
        assert r.status_code == 200, r.text


def _admin_key(dsn: str) -> str:
    """An admin key of ``acme``, made straight in the running stack's Postgres (what
    ``memstream keys create acme --admin`` does, without starting a CLI process)."""

    async def create() -> str:
        pool = await create_pool(dsn, max_size=1)
        try:
            return await Accounts(pool).create_key("acme", admin=True)
        finally:
            await pool.close()

    return asyncio.run(create())


def _field_named(response: Any) -> str | None:
    """A 400 must say which field was wrong; None if it does."""
    if response.status_code != 400:
        return None
    try:
        error = orjson.loads(response.content)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"400 without the error body: {response.text[:200]}"
    return None if error.get("field") else f"400 naming no field: {error}"


def _fuzz_operation(
    op: Any, url: str, callers: dict[str, dict[str, str]], failures: dict[str, list[str]]
) -> None:
    label = f"{op.method.upper()} {op.path}"
    known = {k: v for k, v in KNOWN.items() if "{" + k + "}" in op.path} or None
    strategy = st.one_of(
        op.as_strategy(),
        op.as_strategy(GenerationMode.NEGATIVE),
        op.as_strategy(path_parameters=known),
        op.as_strategy(GenerationMode.NEGATIVE, path_parameters=known),
    )

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # failures are collected, not shrunk
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        for who, headers in callers.items():
            response = case.call(base_url=url, headers=headers, timeout=60)
            failures.setdefault("", []).append(label)  # the requests sent, per operation
            where = f"{who}: {case.method} {case.formatted_path}"
            try:
                case.validate_response(response, checks=CHECKS)
            except Exception as e:  # schemathesis' FailureGroup: one line per check
                failures.setdefault(label, []).append(f"{where}: {str(e)[:1500]}")
            named = _field_named(response)
            if named is not None:
                failures.setdefault(label, []).append(f"{where}: {named}")

    run()


def _fuzz(url: str, callers: dict[str, dict[str, str]], admin_token: str) -> dict[str, list[str]]:
    doc = httpx.get(f"{url}/openapi.json", timeout=60).json()
    schema = schemathesis.openapi.from_dict(doc)
    failures: dict[str, list[str]] = {}
    operations = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # an operation the schema could not describe
        op = result.ok()
        operations += 1
        mine = dict(callers)
        if op.path.startswith("/admin") and (op.method.upper(), op.path) not in NO_ADMIN_TOKEN:
            mine["admin token"] = {"Authorization": f"Bearer {admin_token}"}
        _fuzz_operation(op, url, mine, failures)
    assert operations >= 20, f"only {operations} operations in /openapi.json"
    return failures


def test_every_route_keeps_its_contract_under_fuzzing(up: tuple[str, Path]) -> None:
    url, data = up
    _seed(url)
    state = read_state(data)
    assert state is not None
    env = {
        **os.environ,
        # schemathesis builds some strategies from sets: with one hash seed, the same cases
        # every run (derandomize alone fixes hypothesis' own choices)
        "PYTHONHASHSEED": "0",
        "FUZZ_URL": url,
        "FUZZ_ADMIN_KEY": _admin_key(str(state["postgres_dsn"])),
        "FUZZ_ADMIN_TOKEN": str(state["admin_token"]),
    }
    res = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_openapi_fuzz"],
        env=env, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr.decode()[-4000:]
    failures: dict[str, list[str]] = orjson.loads(res.stdout.splitlines()[-1])
    sent = failures.pop("")
    # every operation was fuzzed, each with several cases
    assert len(set(sent)) >= 20 and len(sent) >= 3 * 3 * len(set(sent)), sorted(set(sent))
    report = "\n".join(
        f"{label}:\n  " + "\n  ".join(sorted(set(found))[:5]) for label, found in failures.items()
    )
    assert failures == {}, report


def main() -> None:
    """The fuzz itself, in its own process (see the test): prints its failures as JSON."""
    callers = {
        "admin key": {
            "Authorization": f"Bearer {os.environ['FUZZ_ADMIN_KEY']}",
            "X-Memstream-User": "alice",
        },
        "ordinary key": {"Authorization": f"Bearer {KEY}", "X-Memstream-User": "alice"},
        "no key": {},
    }
    failures = _fuzz(os.environ["FUZZ_URL"], callers, os.environ["FUZZ_ADMIN_TOKEN"])
    sys.stdout.write(orjson.dumps(failures).decode() + "\n")


if __name__ == "__main__":
    main()
