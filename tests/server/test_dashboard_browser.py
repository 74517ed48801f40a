"""/dashboard in a real headless browser (Debian's chromium, driven by
Playwright; nothing is downloaded), against both deployments: the page asks
for the operator key, shows the pool, and its figures change while requests
run, without a reload. BULKHEAD_DASHBOARD_SCREENSHOT=PATH keeps a
screenshot taken while requests run (docs/dashboard.png is one)."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from tests.conftest import openai_client, write_keys_file
from tests.server_process import OPERATOR_KEY, ServerProcess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium (Debian package 'chromium'; .ci/run installs it)"),
]
# The browser may reach this machine's loopback only: no proxy, and every
# host name but the server's address resolves to nothing.
LOOPBACK_ONLY = ["--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROLES = {
    "colocated": ["--role", "colocated"],
    "disaggregated": ["--role", "local", "--threads", "1"],
}


@pytest.fixture(params=sorted(ROLES))
def server(request, tmp_path, long_tiny_model_dir):
    flags = [*ROLES[request.param], "--model", str(long_tiny_model_dir), "--model-id", "tiny", "--kv-memory", "2MiB",
             "--context-length", "2048", "--api-keys", str(write_keys_file(tmp_path)), "--cluster-key-file", str(tmp_path / "cluster.key")]
    proc = ServerProcess(flags, tmp_path / "server.log").wait_ready(timeout=300)
    yield proc
    proc.stop()


@pytest.fixture
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test extra")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=LOOPBACK_ONLY)
        try:
            yield browser.new_page(viewport={"width": 1100, "height": 900})
        finally:
            browser.close()


def column(page, table: str, header: str) -> list[int]:
    """The integers in one column of one of the page's tables."""
    return page.evaluate("""([table, header]) => {
        const t = document.getElementById(table);
        const i = [...t.tHead.rows[0].cells].findIndex((c) => c.textContent === header);
        return [...t.tBodies[0].rows].map((r) => parseInt(r.cells[i].textContent, 10));
    }""", [table, header])


def wait_until(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what}")
        time.sleep(0.2)
    return value


def test_the_dashboard_shows_the_pool_and_follows_requests_live(server, page):
    page.goto(server.url + "/dashboard")
    page.wait_for_selector("#keyform", state="visible")  # keys are on: the page asks, the URL carries none
    page.fill("#key", OPERATOR_KEY)
    page.click("#keyform button")
    wait_until("a pool", lambda: column(page, "pools", "pages"))
    pages = column(page, "pools", "pages")
    assert all(n > 0 for n in pages)
    assert len(pages) == (2 if "local" in server.args else 1)  # a prefill and a decode pool, or one
    before = sum(column(page, "pools", "allocated (total)"))
    assert OPERATOR_KEY not in page.url

    def run(key: str) -> None:
        openai_client(server.url, key).completions.create(model="tiny", prompt="Hello " * 200, max_tokens=200,
                                                          extra_body={"ignore_eos": True})

    load = [threading.Thread(target=run, args=(key,)) for key in ["sk-alpha-test", "sk-beta-test"] * 3]
    for t in load:
        t.start()
    try:
        # While a request runs, the page (not reloaded) shows its tenant and its pages.
        wait_until("alpha served", lambda: "alpha" in page.inner_text("#tenants"))
        wait_until("pages allocated", lambda: sum(column(page, "pools", "allocated (total)")) > before)
        # Every pool's figures move (a worker's come with its heartbeats, so the prefill pool's may lag).
        wait_until("pages allocated in every pool", lambda: all(column(page, "pools", "allocated (total)")))
        if shot := os.environ.get("BULKHEAD_DASHBOARD_SCREENSHOT"):
            wait_until("pages owned", lambda: sum(column(page, "pools", "owned")) > 0, timeout=10)
            page.screenshot(path=shot, full_page=True)
    finally:
        for t in load:
            t.join(timeout=120)
    # After they end, the pages they held were scrubbed, and the page says so.
    wait_until("pages scrubbed", lambda: sum(column(page, "pools", "scrubbed (total)")) > 0)
    assert page.inner_text("#status").startswith("updated")
