"""The web page in a real browser (Debian's chromium, headless, driven by Playwright) against a real
``stagewise serve`` of the demo model across two virtual devices.

Every wait is on the page's own state (``document.body.dataset``, rendered rows), never a sleep.
``STAGEWISE_WEBUI_SCREENSHOTS=docs`` writes the guide's screenshots into docs/.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_server_status import plan_of_demo
from tests.test_server_support import REPO, ServedModel, serving, start_demo

CHROMIUM = os.environ.get("STAGEWISE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000  # generous: a 2-core machine running other tests

pytestmark = pytest.mark.slow


def _browser_or_skip() -> Any:
    """Playwright's sync API and the chromium binary, or a skip naming what is missing (a failure in CI,
    where ``STAGEWISE_REQUIRE_BROWSER=1``: there scripts/setup_venv.sh must have installed both)."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright Python package (pip install -e '.[test]')")
    if not Path(CHROMIUM).exists():
        missing.append(f"chromium at {CHROMIUM} (apt-get install chromium; `make test` runs scripts/setup_browser.sh, which tries it)")
    if missing:
        if os.environ.get("STAGEWISE_REQUIRE_BROWSER") == "1":
            pytest.fail("browser tests required but missing: " + "; ".join(missing))
        pytest.skip("no browser to test the web page with: missing " + "; ".join(missing))
    return sync_playwright


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    sync_playwright = _browser_or_skip()
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        # a fresh profile per run (launch_persistent_context is how Playwright takes --user-data-dir)
        context = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, args=FLAGS,
                                                       headless=True, bypass_csp=True,
                                                       viewport={"width": 1400, "height": 950})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    page.close()
    assert not errors, errors  # an exception in the page's scripts is a bug


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    served = start_demo(tmp_path_factory.mktemp("webui") / "serve.log")
    with serving(served):
        yield served


def _ready(page: Any, polls_after: int = 0) -> None:
    page.wait_for_function(f"document.body.dataset.phase === 'ready' && Number(document.body.dataset.polls) > "
                           f"{polls_after}", timeout=WAIT_MS)


def _screenshot(page: Any, selector: str, name: str, tmp_path: Path) -> None:
    where = REPO / "docs" if os.environ.get("STAGEWISE_WEBUI_SCREENSHOTS") == "docs" else tmp_path
    page.locator(selector).screenshot(path=str(where / name))


def _set_delay(served: ServedModel, seconds: float) -> None:
    r = httpx.post(f"{served.url}/debug/step-delay", json={"seconds": seconds}, headers=served.headers, timeout=10)
    assert r.status_code == 200, r.text


def test_placement_view_shows_the_certified_plan(page: Any, demo: ServedModel, tmp_path: Path) -> None:
    page.goto(demo.url + "/")
    _ready(page)
    plan = plan_of_demo()
    status = httpx.get(f"{demo.url}/v1/stagewise/status", timeout=10).json()["placement"]
    assert page.locator("#fingerprint").inner_text() == plan["fingerprint"] == status["fingerprint"]
    rows = page.locator("#stages tbody tr.stage")
    assert rows.count() == 2
    for k, (planned, shown) in enumerate(zip(plan["stages"], status["stages"], strict=True)):
        row = rows.nth(k)
        assert row.get_attribute("data-device") == planned["device"]
        assert row.get_attribute("data-blocks") == "{}-{}".format(*planned["blocks"])
        assert int(row.get_attribute("data-planned-total")) == planned["charge"]["total_bytes"]
        assert int(row.get_attribute("data-measured-total")) == shown["measured"]["total_bytes"]
        card = page.locator(f"#devices .device[data-device='{planned['device']}']")
        assert card.locator(".stage-bars").count() == 1
        assert card.locator(".bar.planned .seg").count() == 4  # weights, KV + state, workspace, reserve
    (first, cut), (_, last) = (stage["blocks"] for stage in plan["stages"])
    assert f"embedding + {first}–{cut - 1}" in rows.nth(0).inner_text()
    assert (f"{cut}" if last - cut == 1 else f"{cut}–{last - 1}") + " + head" in rows.nth(1).inner_text()
    assert page.locator("#links tbody tr").first.get_attribute("data-kind") == "same-device"
    _screenshot(page, "#placement-pane", "webui_placement.png", tmp_path)


def test_chat_streams_and_live_counters_move(page: Any, demo: ServedModel, tmp_path: Path) -> None:
    page.goto(demo.url + "/")
    _ready(page)
    page.click("#chat-settings summary")
    page.fill("#system-prompt", "You are terse.")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    page.fill("#stop", "zzzz")
    page.fill("#prompt", "Hello there")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.press("#prompt", "Enter")
    body = sent.value.post_data_json
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert (body["temperature"], body["max_tokens"], body["stop"], body["stream"]) == (0, 24, ["zzzz"], True)
    answer = page.locator(".message.assistant").last
    page.wait_for_selector(".message.assistant[data-done='true']", timeout=WAIT_MS)
    assert answer.locator(".content").inner_text().strip()
    stats = answer.locator(".stats")
    assert "TTFT" in stats.inner_text() and "tok/s" in stats.inner_text()
    assert 1 <= int(stats.get_attribute("data-tokens")) <= 24
    _screenshot(page, "#chat-pane", "webui_chat.png", tmp_path)

    # a long answer, slowed down, so that it runs while the page polls: the live pane must show it
    running = "document.getElementById('live-running').textContent.startsWith('{} /')"
    page.wait_for_function(running.format(0), timeout=WAIT_MS)
    generated = int(page.locator("#live-generated").inner_text())
    _set_delay(demo, 0.05)
    try:
        page.fill("#temperature", "0.8")  # sampled: the demo's greedy text is mostly partial characters
        page.fill("#max-tokens", "400")
        page.fill("#prompt", "Tell me more")
        page.press("#prompt", "Enter")
        streaming = "!document.querySelector('.message.assistant:last-child').dataset.done"
        page.wait_for_function("document.querySelector('.message.assistant:last-child .content').textContent.length"
                               f" > 0 && {streaming}", timeout=WAIT_MS)  # tokens arrive while it still streams
        page.wait_for_function(f"{running.format(1)} && {streaming}", timeout=WAIT_MS)
        page.wait_for_function("!document.querySelector('#live-stages tr[data-stage=\"0\"] .kv')"
                               f".textContent.startsWith('0 /') && {streaming}", timeout=WAIT_MS)  # KV blocks in use
        page.wait_for_function(f"Number(document.getElementById('live-generated').textContent) > {generated} && "
                               f"Number(document.getElementById('live-decode').textContent) > 0 && {streaming}",
                               timeout=WAIT_MS)
        _screenshot(page, "main", "webui_live.png", tmp_path)
        page.click("#stop-answer")
        page.wait_for_selector(".message.assistant[data-done='error']", timeout=WAIT_MS)
        assert "stopped" in page.locator(".message.assistant").last.locator(".stats").inner_text()
    finally:
        _set_delay(demo, 0.0)
    page.wait_for_function(running.format(0), timeout=WAIT_MS)  # the server cancelled it


def test_tool_calls_and_reasoning_are_rendered(page: Any, demo: ServedModel) -> None:
    page.goto(demo.url + "/")
    _ready(page)
    page.click("#chat-settings summary")
    tools = ('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
             '"properties": {"city": {"type": "string"}}, "required": ["city"]}}}]')
    page.fill("#tools", tools)
    page.select_option("#tool-choice", "required")  # forced: the demo model must call it
    page.fill("#max-tokens", "48")
    page.fill("#prompt", "Weather in Paris?")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".message.assistant[data-done='true']", timeout=WAIT_MS)
    call = page.locator(".message.assistant").last.locator(".tool-call")
    assert call.count() == 1 and "get_weather" in call.inner_text() and '"city"' in call.inner_text()
    # reasoning: a model's <think> section (and reasoning deltas) render apart from the answer
    page.evaluate("""async () => {
        const { Answer } = await import('/webui/chat.js');
        const a = new Answer();
        a.node.id = 'synthetic';
        a.add({choices: [{index: 0, delta: {content: '<think>weigh it'}}]});
        a.add({choices: [{index: 0, delta: {content: ' up</think>The answer.'}, finish_reason: 'stop'}]});
    }""")
    shown = page.locator("#synthetic")
    assert shown.locator(".reasoning-text").inner_text() == "weigh it up"
    assert shown.locator(".content").inner_text() == "The answer."
    # the server's reasoning deltas (a thinking model's block returned apart) go back with the turn
    history = page.evaluate("""async () => {
        const { Answer } = await import('/webui/chat.js');
        const a = new Answer();
        a.add({choices: [{index: 0, delta: {reasoning_content: 'It is', reasoning: 'It is'}}]});
        a.add({choices: [{index: 0, delta: {reasoning_content: ' Paris.', reasoning: ' Paris.'}}]});
        a.add({choices: [{index: 0, delta: {content: 'Paris.'}, finish_reason: 'stop'}]});
        return a.message();
    }""")
    assert history == {"role": "assistant", "content": "Paris.", "reasoning_content": "It is Paris."}


def test_api_key_is_asked_for_and_sent(page: Any, tmp_path: Path) -> None:
    served = start_demo(tmp_path / "key.log", api_key="sekret-key")
    try:
        served.wait_ready()
        assert httpx.get(f"{served.url}/v1/stagewise/status", timeout=10).status_code == 401
        page.goto(served.url + "/")  # the page itself needs no key
        page.wait_for_selector("#key-dialog[open]", timeout=WAIT_MS)
        page.fill("#key-input", "sekret-key")
        page.click("#key-save")
        _ready(page)
        page.fill("#prompt", "Hello")
        with page.expect_request("**/v1/chat/completions") as sent:
            page.press("#prompt", "Enter")
        assert sent.value.headers["authorization"] == "Bearer sekret-key"
        page.wait_for_selector(".message.assistant[data-done='true']", timeout=WAIT_MS)
    finally:
        assert served.stop() == 0, served.log.read_text()[-3000:]


def test_page_survives_a_server_restart(page: Any, tmp_path: Path) -> None:
    log = tmp_path / "restart.log"
    first = start_demo(log)
    try:
        first.wait_ready()
        page.goto(first.url + "/")
        _ready(page)
    finally:
        assert first.stop() == 0, log.read_text()[-3000:]
    page.wait_for_function("document.body.dataset.connected === 'false'", timeout=WAIT_MS)
    assert page.locator("#phase").inner_text() == "unreachable"
    polls = int(page.evaluate("document.body.dataset.polls"))
    second = start_demo(log, port=first.port)
    try:
        second.wait_ready()
        _ready(page, polls)  # the same page, not reloaded, polls the new server
        assert page.locator("#stages tbody tr.stage").count() == 2
        page.fill("#prompt", "Are you back?")
        page.press("#prompt", "Enter")
        page.wait_for_selector(".message.assistant[data-done='true']", timeout=WAIT_MS)
    finally:
        assert second.stop() == 0, log.read_text()[-3000:]
