"""The operator console in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against a real ``memstream up``: log in, watch
every processor's lag drop after a burst of appends, find a malformed event under dead
letters and retry it, read a thread's summary, start a replay; requests without the
session cookie or with a bad CSRF token are refused.

Screenshots of every page go to ``$MEMSTREAM_TEST_ARTIFACTS/console`` (default
``test-artifacts/console`` in the checkout), for a reviewer to look at.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from memstream.schemas.topics import DEFAULT_PREFIX, Topics
from tests.integration.test_cli_up import KEY, cli, start_up, stop_up
from tests.kafka_helpers import produce

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = (
    Path(os.environ.get("MEMSTREAM_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
    / "console"
)
PROCESSORS = ("counters", "summarizer", "message-projector", "memory-projector")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
)


def wait_until(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # a page mid-swap: try again
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def system(traversable_tmp: Path) -> Iterator[tuple[str, dict[str, object]]]:
    data = traversable_tmp / "console-up"
    proc, url = start_up(data)
    try:
        state = json.loads((data / "memstream.json").read_text())
        state["data_dir"] = str(data)
        yield url, state
    finally:
        assert stop_up(proc) == []


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    opts = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,800")
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def shot(driver: WebDriver, name: str) -> None:
    """A full-page PNG (the whole scroll height at 1280 wide), through the DevTools protocol."""
    import base64

    assert isinstance(driver, webdriver.Chrome)
    got = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(got["data"]))


def text(driver: WebDriver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


@pytest.mark.timeout(600)
def test_console(system: tuple[str, dict[str, object]], browser: WebDriver) -> None:
    url, state = system
    d = browser
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    admin = {"X-Memstream-Admin-Token": str(state["admin_token"])}

    # --- log in: no session -> the login form; a wrong key is refused -----------------------
    d.get(url + "/console")
    assert d.current_url.endswith("/console/login")
    shot(d, "01-login")
    d.find_element(By.ID, "key").send_keys("wrong-key")
    d.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    # the refusal is a new page: wait for it (read at once, the old form may still be there)
    wait_until(lambda: "not valid" in text(d, ".error"), 30, "the refused key")
    d.find_element(By.ID, "key").send_keys(str(state["admin_token"]))
    d.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_until(lambda: d.current_url.endswith("/console"), 30, "the overview after login")
    cookie = d.get_cookie("memstream_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    csrf = d.find_element(By.CSS_SELECTOR, "meta[name=csrf-token]").get_attribute("content")
    assert csrf

    # --- overview: every processor, every part healthy ---------------------------------------
    for p in PROCESSORS:
        wait_until(
            functools.partial(d.find_elements, By.CSS_SELECTOR, f"tr[data-processor='{p}']"),
            30,
            f"processor {p} on the overview",
        )
    parts = {e.get_attribute("data-part") for e in d.find_elements(By.CSS_SELECTOR, ".health li")}
    assert {"journal", "kafka", "postgres", "redis", "clickhouse", "qdrant"} <= parts
    assert not d.find_elements(By.CSS_SELECTOR, ".health li.bad")

    # a burst of appends: the live chart's lag rises, then drops back to 0 without a reload
    burst = [{"role": "user", "content": f"burst message {i} about kafka lag"} for i in range(500)]
    for t in range(40):
        r = httpx.post(
            url + "/admin/append",
            json={"account_id": "acme", "agent_id": "bot", "thread_id": f"b{t}", "messages": burst},
            headers=admin,
            timeout=60,
        )
        assert r.status_code == 200, r.text
    marker = d.find_element(By.ID, "live")
    d.execute_script("arguments[0].dataset.loaded = 'once'", marker)

    def lag_series() -> dict[str, list[int | None]]:
        got = d.execute_async_script(
            "const done = arguments[0];"
            "fetch('/console/overview/lag.json').then(r => r.json()).then(done, () => done(null));"
        )
        assert isinstance(got, dict)
        series: dict[str, list[int | None]] = got["series"]
        return series

    def peak_then_zero() -> bool:
        series = lag_series()
        journal = [k for k in series if k.startswith(("counters ", "message-projector "))]
        if not journal:
            return False
        peaks = [max(v or 0 for v in series[k]) for k in journal]
        lasts = [series[k][-1] for k in journal]
        return max(peaks) > 0 and all(v == 0 for v in lasts)

    wait_until(peak_then_zero, 180, "a lag peak that drops back to 0")

    def table_at_zero() -> bool:  # the table is swapped every 2 s: read it in one go, retry
        cells = d.find_elements(By.CSS_SELECTOR, "#processors td.lag")
        return bool(cells) and all(int(e.text) == 0 for e in cells)

    wait_until(table_at_zero, 60, "the table's lag at 0")
    # the page was swapped in place (htmx), not reloaded: our marker is still on it
    assert d.find_element(By.ID, "live").get_attribute("data-loaded") == "once"
    assert d.find_elements(By.CSS_SELECTOR, "#lag-chart canvas")
    shot(d, "02-overview")

    # --- a malformed event: listed as failing, leaves that state after retry -----------------
    topics = Topics(str(state.get("topic_prefix") or DEFAULT_PREFIX))
    bad = b'{"this is": "not an envelope"'
    asyncio.run(produce(str(state["kafka_bootstrap"]), topics.journal, [("acme/bot/x", bad)]))
    d.get(url + "/console/dlq")

    def failing_rows() -> list[WebElement]:
        d.get(url + "/console/dlq")
        return d.find_elements(By.CSS_SELECTOR, "tr[data-letter]")

    rows = wait_until(failing_rows, 90, "the malformed event under dead letters")
    assert isinstance(rows, list)
    ids = [r.get_attribute("data-letter") for r in rows]
    assert "DecodeError" in text(d, "#letter-table")
    shot(d, "03-dead-letters")
    d.find_element(By.CSS_SELECTOR, "tr[data-letter] a").click()
    assert "not an envelope" in text(d, "main")
    assert text(d, "#letter-state") == "failing"
    shot(d, "04-dead-letter")
    d.get(url + "/console/dlq")
    for box in d.find_elements(By.CSS_SELECTOR, "tr[data-letter] input[type=checkbox]"):
        box.click()
    d.find_element(By.ID, "retry-selected").click()
    wait_until(lambda: "Re-published 1." in text(d, "#letters"), 60, "the retry outcome")
    remaining = {
        e.get_attribute("data-letter") for e in d.find_elements(By.CSS_SELECTOR, "tr[data-letter]")
    }
    assert not remaining & set(ids), "retried letters are still listed as failing"
    shot(d, "05-dead-letters-after-retry")
    d.get(url + "/console/dlq?state=retried")
    retried = {
        e.get_attribute("data-letter") for e in d.find_elements(By.CSS_SELECTOR, "tr[data-letter]")
    }
    assert set(ids) <= retried

    # --- a thread's page shows its summary ----------------------------------------------------
    msgs = [
        {"role": "user", "content": f"we discussed the deployment plan, step {i}"}
        for i in range(60)
    ]
    r = api.post("/v1/agents/bot/threads/plan/messages", json={"messages": msgs})
    assert r.status_code == 201, r.text
    call = {"id": "call-1", "name": "lookup_runbook", "arguments": {"service": "relay"}}
    r = api.post(  # another thread: the ~2,700-token result would start a second summary
        "/v1/agents/bot/threads/tools/messages",
        json={
            "messages": [
                {"role": "assistant", "content": "checking the runbook", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call-1", "content": "runbook line. " * 900},
            ]
        },
    )
    assert r.status_code == 201, r.text
    summary = wait_until(
        lambda: (
            api.get("/v1/agents/bot/threads/plan/summary").status_code == 200
            and api.get("/v1/agents/bot/threads/plan/summary").json()
        ),
        120,
        "the thread's summary",
    )
    assert isinstance(summary, dict)

    def plan_ranks_first() -> bool:
        # The burst threads are searchable long before this one (and the dense side finds
        # them for any query): wait until the thread that says "deployment" is, and ranks first.
        d.get(url + "/console/threads?account=acme&agent=bot&q=deployment")
        hits = d.find_elements(By.CSS_SELECTOR, ".hits a")
        return bool(hits) and hits[0].text == "plan"

    wait_until(plan_ranks_first, 60, "the deployment thread first among the search hits")
    shot(d, "06-threads-search")
    d.find_element(By.CSS_SELECTOR, ".hits a").click()
    assert "version 1" in text(d, "#summary h2")
    assert summary["content"][:40] in text(d, "#summary .summary-text")
    assert "step 59" in text(d, "#window")
    shot(d, "07-thread")
    # a tool call, paged: 4 KB per page, the next page on demand
    d.get(url + "/console/threads/acme/bot/tools")
    d.find_element(By.CSS_SELECTOR, ".toolcall button").click()
    wait_until(lambda: "lookup_runbook" in text(d, ".tc"), 30, "the tool call's first page")
    assert "bytes 0–4096 of" in text(d, ".tc")
    d.find_element(By.CSS_SELECTOR, ".tc button").click()
    wait_until(lambda: "bytes 4096–" in text(d, ".tc"), 30, "the tool call's second page")
    shot(d, "07-thread-tool-call")

    # --- memory: an entry edited in the console is what recall then returns -----------------
    res = cli("keys", "create", "acme", "--admin", "--data-dir", str(state["data_dir"]))
    assert res.returncode == 0, res.stderr
    admin_key = res.stdout.strip().splitlines()[-1]
    assert api.put("/v1/agents/bot", json={"memory": True}).status_code == 200
    body = {
        "key": "deploy-day",
        "content": "Deploys happen on Tuesdays",
        "category": "project_fact",
        "scope": "shared",
        "importance": 0.8,
    }
    r = api.post("/v1/agents/bot/memory/store", json=body)
    assert r.status_code == 200, r.text
    d.get(url + "/console/memory?agent=bot")
    d.find_element(By.NAME, "admin_key").send_keys(admin_key)
    d.find_element(By.CSS_SELECTOR, "form[action='/console/memory/key'] button").click()
    row = wait_until(
        lambda: d.find_elements(By.CSS_SELECTOR, "tr[data-key='deploy-day']"), 30, "the entry"
    )
    assert isinstance(row, list)
    area = row[0].find_element(By.TAG_NAME, "textarea")
    area.clear()
    area.send_keys("Deploys happen on Thursdays after the freeze")
    row[0].find_element(By.CSS_SELECTOR, "button.save").click()
    wait_until(lambda: "deploy-day: replaced" in text(d, "#memory-message"), 30, "the edit")
    shot(d, "08-memory")

    def recalled() -> bool:
        r = api.post("/v1/agents/bot/memory/recall", json={"query": "when do deploys happen"})
        hits = [e for e in r.json()["results"] if e["key"] == "deploy-day"]
        return bool(hits) and hits[0]["content"] == "Deploys happen on Thursdays after the freeze"

    wait_until(recalled, 60, "recall to return the edited entry")
    exported = d.execute_async_script(
        "const done = arguments[0];"
        "fetch(document.getElementById('export').href).then(r => r.text()).then(done, () => done(''));"
    )
    assert "Thursdays after the freeze" in exported and "Tuesdays" not in exported
    # an edit the memory rules refuse is refused here too, naming the field
    imp = d.find_element(By.CSS_SELECTOR, "tr[data-key='deploy-day'] input[name=importance]")
    imp.clear()
    imp.send_keys("7")
    d.find_element(By.CSS_SELECTOR, "tr[data-key='deploy-day'] button.save").click()
    wait_until(lambda: "importance" in text(d, ".error"), 30, "the refused edit")

    # --- replay: start a rebuild, watch it finish ------------------------------------------------
    d.get(url + "/console/replay")
    Select(d.find_element(By.NAME, "projection")).select_by_visible_text("memory")
    d.find_element(By.ID, "start-replay").click()
    wait_until(
        lambda: "done" in text(d, ".replay[data-projection=memory] h2"), 120, "the replay to end"
    )
    shot(d, "09-replay")

    # --- on a phone's width the pages reflow (one column; wide tables scroll inside) ----------
    d.set_window_size(390, 844)
    d.get(url + "/console")
    wait_until(lambda: d.find_elements(By.CSS_SELECTOR, "#lag-chart canvas"), 30, "the chart")
    page_width = d.execute_script("return document.documentElement.scrollWidth")
    assert page_width <= 400, f"the overview overflows a phone's width ({page_width}px)"
    shot(d, "10-overview-phone")
    d.get(url + "/console/dlq?state=all")
    assert d.execute_script("return document.documentElement.scrollWidth") <= 400
    shot(d, "11-dead-letters-phone")
    d.set_window_size(1280, 800)

    # --- refused: no session cookie, a bad CSRF token ------------------------------------------
    raw = httpx.Client(base_url=url, timeout=30)
    r = raw.get("/console", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    r = raw.post("/console/dlq/retry", data={"id": ids[0], "csrf_token": csrf})
    assert r.status_code == 401
    logged_in = httpx.Client(
        base_url=url, timeout=30, cookies={"memstream_console": cookie["value"]}
    )
    r = logged_in.post("/console/dlq/retry", data={"id": ids[0], "csrf_token": "forged"})
    assert r.status_code == 403
    r = logged_in.post("/console/dlq/retry", data={"id": ids[0]})
    assert r.status_code == 403
    r = logged_in.post("/console/replay", data={"projection": "memory"})
    assert r.status_code == 403
    # the real token passes (the same request shape is not refused for another reason)
    r = logged_in.post("/console/dlq/retry", data={"id": ids[0], "csrf_token": csrf})
    assert r.status_code == 200

    # --- logging out ends the session: its cookie no longer opens anything ----------------------
    d.get(url + "/console")
    d.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait_until(lambda: d.current_url.endswith("/console/login"), 30, "the login form")
    r = logged_in.get("/console", follow_redirects=False)
    assert r.status_code == 303
    r = logged_in.post("/console/dlq/retry", data={"id": ids[0], "csrf_token": csrf})
    assert r.status_code == 401
    for c in (api, raw, logged_in):
        c.close()
