"""Signed end-user tokens through the HTTP app, the MCP endpoint and the CLI (real
Postgres, SlateDB): a token acts for its one user only, with the account key or alone as
the bearer; expired, tampered and foreign tokens are 401 naming the header; the account
setting refuses the bare user header and user-less calls."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx import user_tokens
from memstream.agents_ctx.memory.store import MemoryService
from memstream.infra.accounts import Accounts
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.summary_store import SummaryStore
from tests.fixtures.api import ApiStack
from tests.fixtures.stores import fresh_database

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session", autouse=True)
async def context_services(
    api_stack: ApiStack, redis_client: aioredis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    svc = api_stack.services
    svc.memory = MemoryService(api_stack.pool, api_stack.clock, binding=svc.accounts)
    svc.summary_store = SummaryStore(
        LocalStore(prefix=tmp_path_factory.mktemp("objects"), mkdir=True), redis_client
    )
    yield
    svc.memory = svc.summary_store = None


async def token_for(stack: ApiStack, account: str, user: str, ttl: int = 600) -> str:
    secret = await stack.services.accounts.user_token_secret(account, create=True)
    assert secret is not None
    return user_tokens.mint(secret, account, user, ttl)


def url(agent: str, thread: str, tail: str = "") -> str:
    return f"/v1/agents/{agent}/threads/{thread}{tail}"


async def test_a_token_acts_for_its_user_only(api_stack: ApiStack) -> None:
    c = api_stack.client
    alice = await token_for(api_stack, "acme", "alice")
    msg = {"role": "user", "content": "alice's secret plan"}
    # with the account key, in place of X-Memstream-User
    h = api_stack.headers() | {"X-Memstream-User-Token": alice}
    r = await c.post(url("tok", "a1", "/messages"), json=msg, headers=h)
    assert r.status_code == 201
    # alone, as the bearer: no account key at all
    bearer = {"Authorization": f"Bearer {alice}"}
    r = await c.get(url("tok", "a1", "/context"), headers=bearer)
    assert r.status_code == 200 and "secret plan" in r.text
    # the thread is alice's: bob (by header) does not see it
    r = await c.get(url("tok", "a1", "/context"), headers=api_stack.headers(user="bob"))
    assert r.status_code == 404
    # a token cannot be combined with another user's header
    r = await c.get(url("tok", "a1", "/context"), headers=bearer | {"X-Memstream-User": "bob"})
    assert r.status_code == 401 and r.json()["error"]["field"] == "X-Memstream-User"
    # a bob thread stays bob's, even for alice's bearer token
    await c.post(url("tok", "b1", "/messages"), json=msg, headers=api_stack.headers(user="bob"))
    r = await c.get(url("tok", "b1", "/context"), headers=bearer)
    assert r.status_code == 404


async def test_a_token_alone_cannot_act_beyond_its_user(api_stack: ApiStack) -> None:
    """A browser holding alice's token cannot switch Memory off for every user, delete or
    erase the thread every user shares, or use the key routes; the account key can."""
    c = api_stack.client
    bearer = {"Authorization": f"Bearer {await token_for(api_stack, 'acme', 'alice')}"}
    agent = "tokscope"
    r = await c.put(f"/v1/agents/{agent}", json={"memory": True}, headers=api_stack.headers())
    assert r.status_code == 200
    r = await c.put(f"/v1/agents/{agent}", json={"memory": False}, headers=bearer)
    assert r.status_code == 403 and r.json()["error"]["field"] == "Authorization"
    assert (await api_stack.services.accounts.get_agent("acme", agent)).memory is True  # type: ignore[union-attr]  # configured above
    # a shared thread (opened without a user): alice reads and writes it, but cannot remove it
    msg = {"role": "user", "content": "team notes"}
    assert (await c.post(url(agent, "team", "/messages"), json=msg, headers=api_stack.headers())).status_code == 201  # fmt: skip
    assert (await c.post(url(agent, "team", "/messages"), json=msg, headers=bearer)).status_code == 201  # fmt: skip
    for method, tail in (("DELETE", ""), ("POST", "/erase")):
        for headers in (bearer, api_stack.headers(user="alice")):
            r = await c.request(method, url(agent, "team", tail), headers=headers)
            assert r.status_code == 403, (method, r.text)
            assert r.json()["error"]["field"] == "thread_id"
    r = await c.get(url(agent, "team", "/context"), headers=api_stack.headers())
    assert r.status_code == 200 and len(r.json()["messages"]) == 2  # nothing was removed
    # alice's own thread: hers to delete; the key routes: 403, not "unknown API key"
    assert (await c.post(url(agent, "mine", "/messages"), json=msg, headers=bearer)).status_code == 201  # fmt: skip
    assert (await c.delete(url(agent, "mine"), headers=bearer)).status_code == 204
    r = await c.post("/v1/users/alice/erase", headers=bearer)
    assert r.status_code == 403 and r.json()["error"]["field"] == "Authorization", r.text
    # the agent's own key (no user) may delete the shared thread
    assert (await c.delete(url(agent, "team"), headers=api_stack.headers())).status_code == 204


async def test_bad_tokens_are_401_naming_the_header(api_stack: ApiStack) -> None:
    c = api_stack.client
    secret = await api_stack.services.accounts.user_token_secret("acme", create=True)
    assert secret is not None
    expired = user_tokens.mint(secret, "acme", "alice", 1, now=time.time() - 10)
    good = user_tokens.mint(secret, "acme", "alice", 600)
    payload, sig = good[len(user_tokens.PREFIX) :].split(".")
    forged_payload = user_tokens.mint(b"not the secret", "acme", "mallory", 600)
    tampered = forged_payload.split(".")[0] + "." + sig
    other = await token_for(api_stack, "other", "alice")
    for token, why in (
        (expired, "expired"),
        (tampered, "signature"),
        ("mst_garbage", "malformed"),
        (other, "another account"),
    ):
        h = api_stack.headers() | {"X-Memstream-User-Token": token}
        r = await c.get(url("tok2", "t", "/context"), headers=h)
        assert r.status_code == 401, why
        assert r.json()["error"]["field"] == "X-Memstream-User-Token", why
        assert why in r.json()["error"]["message"], why
    r = await c.get(url("tok2", "t", "/context"), headers={"Authorization": f"Bearer {expired}"})
    assert r.status_code == 401


async def test_the_account_setting_requires_tokens(api_stack: ApiStack) -> None:
    c, accounts = api_stack.client, api_stack.services.accounts
    token = await token_for(api_stack, "other", "alice")
    assert await accounts.set_require_user_tokens("other", True)
    try:
        key = api_stack.other_key
        for headers in (api_stack.headers(key=key, user="alice"), api_stack.headers(key=key)):
            r = await c.get(url("req", "t", "/context"), headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["field"] == "X-Memstream-User-Token"
        h = api_stack.headers(key=key) | {"X-Memstream-User-Token": token}
        assert (await c.get(url("req", "t", "/context"), headers=h)).status_code == 200
        # the MCP endpoint follows the same rule
        ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        r = await c.post("/v1/agents/req/mcp", json=ping, headers=api_stack.headers(key=key))
        assert r.status_code == 401
        # another account is not affected
        r = await c.get(url("req", "t", "/context"), headers=api_stack.headers(user="alice"))
        assert r.status_code == 200
    finally:
        await accounts.set_require_user_tokens("other", False)


async def run_cli(dsn: str, *args: str, ok: bool = True) -> tuple[int, str]:
    """``memstream ARGS`` against the database ``dsn``: (exit status, stdout + stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "memstream",
        *args,
        env=dict(os.environ) | {"MEMSTREAM_POSTGRES_DSN": dsn, "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, errs = await proc.communicate()
    if ok:
        assert proc.returncode == 0, errs.decode()
    return proc.returncode or 0, (out + errs).decode().strip()


async def test_the_cli_mints_a_token_the_api_accepts(pg_dsn: str) -> None:
    dsn = await fresh_database(pg_dsn)

    async def cli(*args: str) -> str:
        return (await run_cli(dsn, *args))[1]

    await cli("keys", "create", "acct")
    token = await cli("keys", "user-token", "acct", "carol", "--ttl", "120")
    pool = await create_pool(dsn)
    try:
        await migrate(pool)
        secret = await Accounts(pool).user_token_secret("acct")
        assert secret is not None
        claims = user_tokens.verify(secret, token)
        assert (claims.account_id, claims.user_id) == ("acct", "carol")
        assert claims.expires_at <= time.time() + 121
        await cli("keys", "require-user-tokens", "acct")
        assert await Accounts(pool).requires_user_tokens("acct")
    finally:
        await pool.close()


async def test_a_non_ascii_user_is_the_same_user_by_header_token_and_client(
    api_stack: ApiStack,
) -> None:
    """``X-Memstream-User: ålice`` (UTF-8 bytes, as curl sends it) names the user a token, a
    path or the Python client names: it used to arrive as Latin-1 (``Ã¥lice``), another
    user, whose data an erasure of ``ålice`` did not touch."""
    from memstream.client import MemstreamClient

    c, user = api_stack.client, "ålice-josé"
    raw = [
        (b"authorization", f"Bearer {api_stack.key}".encode()),
        (b"x-memstream-user", user.encode()),
    ]
    msg = {"role": "user", "content": "ålice's fjord plan"}
    r = await c.post(url("utf", "u1", "/messages"), json=msg, headers=raw)  # a hot route
    assert r.status_code == 201, r.text
    await c.put("/v1/agents/utf", json={"memory": True}, headers=api_stack.headers())
    fact = {"key": "home", "content": "lives by a fjord", "category": "user_profile"}
    r = await c.post("/v1/agents/utf/memory/store", json=fact | {"scope": "private"}, headers=raw)
    assert r.status_code in (200, 201), r.text  # a route FastAPI serves
    assert r.json()["entry"]["user_id"] == user

    bearer = {"Authorization": f"Bearer {await token_for(api_stack, 'acme', user)}"}
    r = await c.get(url("utf", "u1", "/context"), headers=bearer)
    assert r.status_code == 200 and "fjord plan" in r.text
    r = await c.get("/v1/agents/utf/memory/entries", headers=bearer)
    assert [e["key"] for e in r.json()["entries"]] == ["home"]

    client = MemstreamClient("http://memstream.test", api_stack.key, user, http=c)
    context = await client.context("utf", "u1")
    assert "fjord plan" in str(context["messages"])
    await client.append("utf", "u1", {"role": "user", "content": "and a boat"})
    r = await c.get(url("utf", "u1", "/context"), headers=bearer)
    assert "and a boat" in r.text
    # the ASCII look-alike and the Latin-1 reading are other users
    for other in ("alice-jose", "Ã¥lice-josÃ©"):
        as_other = [raw[0], (b"x-memstream-user", other.encode())]
        r = await c.get(url("utf", "u1", "/context"), headers=as_other)
        assert r.status_code == 404


async def test_a_leaked_key_is_revoked_from_the_cli_and_refused(pg_dsn: str) -> None:
    """``memstream keys revoke KEY`` (there was no way but SQL): the key is refused from
    then on, the account's other keys still work, ``keys list`` shows it revoked."""
    dsn = await fresh_database(pg_dsn)
    leaked = (await run_cli(dsn, "keys", "create", "acct"))[1]
    kept = (await run_cli(dsn, "keys", "create", "acct", "--admin"))[1]
    pool = await create_pool(dsn)
    try:
        accounts = Accounts(pool, key_cache_ttl_s=0.0)
        assert await accounts.authenticate(leaked) == "acct"
        status, text = await run_cli(dsn, "keys", "revoke", leaked)
        assert status == 0 and "acct" in text and leaked not in text  # never echoed whole
        assert await accounts.authenticate(leaked) is None
        assert await accounts.authenticate(kept) == "acct"
        # a re-run is not a failure (scripts re-run revokes); an unknown key is
        status, text = await run_cli(dsn, "keys", "revoke", leaked)
        assert status == 0 and "revoked already" in text
        status, text = await run_cli(dsn, "keys", "revoke", "mk_not-a-key", ok=False)
        assert status == 1 and "no such key" in text
        status, text = await run_cli(dsn, "keys", "list", "acct")
        assert status == 0 and leaked not in text and kept not in text
        revoked = {
            line.split("│")[1].strip(): line.split("│")[-2].strip()
            for line in text.splitlines()
            if leaked[:8] in line or kept[:8] in line
        }
        assert revoked[kept[:8] + "…"] == "-" and revoked[leaked[:8] + "…"].startswith("20")
        status, _ = await run_cli(dsn, "keys", "list", "nobody", ok=False)
        assert status == 1
    finally:
        await pool.close()


async def test_a_revoked_key_is_refused_at_once_by_the_process_that_revoked_it(
    api_stack: ApiStack,
) -> None:
    accounts = api_stack.services.accounts
    key = await accounts.create_key("acme")
    r = await api_stack.client.get(url("rev", "t", "/context"), headers=api_stack.headers(key=key))
    assert r.status_code == 200  # and now cached
    assert await accounts.revoke_key(key) == "acme"
    r = await api_stack.client.get(url("rev", "t", "/context"), headers=api_stack.headers(key=key))
    assert r.status_code == 401


@pytest.mark.parametrize(
    "path", ["/v1/agents/utf/threads/u2/messages", "/v1/agents/utf/memory/recall"]
)
async def test_a_user_header_that_is_not_utf8_is_refused_naming_it(
    api_stack: ApiStack, path: str
) -> None:
    raw = [
        (b"authorization", f"Bearer {api_stack.key}".encode()),
        (b"x-memstream-user", b"\xe5lice"),
    ]
    body = {"role": "user", "content": "hi"} if path.endswith("messages") else {"query": "hi"}
    r = await api_stack.client.post(path, json=body, headers=raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "X-Memstream-User"
