"""/dashboard in a real headless browser (Debian's chromium, driven by
Playwright; nothing is downloaded), against both deployments: the page asks
for the operator key, shows the pool, and its figures and plots change while
requests run, without a reload. BULKHEAD_DASHBOARD_SCREENSHOT=PATH keeps a
screenshot taken while requests run (docs/dashboard.png is one)."""

from __future__ import annotations

import os
import re
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


def path_points(page, plot: str, series: str) -> list[tuple[float, float]]:
    """The (x, y) points of one series' line in one of the page's SVG plots."""
    d = page.evaluate("""([plot, series]) => {
        const p = [...document.querySelectorAll(`#${plot} path.series`)].find((e) => e.dataset.name === series);
        return p ? p.getAttribute("d") : "";
    }""", [plot, series])
    return [(float(x), float(y)) for x, y in re.findall(r"[ML](-?[\d.]+),(-?[\d.]+)", d)]


def drawn_above_zero(points) -> bool:
    """Some point of the line is above the plot's baseline (a value > 0): y grows downwards."""
    return bool(points) and min(y for _, y in points) < max(y for _, y in points)


def tiny_share_bar(page) -> tuple[float, str]:
    """The pool bar the page draws for 1 page owned of 100,000: the owned
    part's width in pixels, and the bar's text."""
    return page.evaluate("""() => {
        const b = bar({num_pages: 100000, owned: 1, cached: 0, dirty: 0, free: 99999});
        document.body.append(b);
        const out = [b.querySelector(".owned").getBoundingClientRect().width, b.textContent];
        b.remove();
        return out;
    }""")


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
    width, label = tiny_share_bar(page)
    assert width >= 3 and "1 in use (0.0%)" in label  # a few pages of many still show, with their number

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
        # The plots draw the server's samples (one every 2 s) and move: alpha's
        # output tokens/s rises above zero, and its line gains points.
        wait_until("alpha's tokens/s plotted", lambda: drawn_above_zero(path_points(page, "plot-tokens", "alpha")))
        line = path_points(page, "plot-tokens", "alpha")
        wait_until("the tokens/s plot moving", lambda: path_points(page, "plot-tokens", "alpha") != line, timeout=20)
        wait_until("a time to first token", lambda: path_points(page, "plot-ttft", "median"))
        wait_until("owned pages plotted", lambda: any(drawn_above_zero(path_points(page, f"plot-pool-{i}", "owned"))
                                                      for i in range(len(pages))))
        assert path_points(page, "plot-transfers", "decode jobs granted, KV being written")
    finally:
        for t in load:
            t.join(timeout=120)
    # After they end, the pages they held were scrubbed, and the page says so.
    wait_until("pages scrubbed", lambda: sum(column(page, "pools", "scrubbed (total)")) > 0)
    assert page.inner_text("#status").startswith("updated")
    if shot := os.environ.get("BULKHEAD_DASHBOARD_SCREENSHOT"):
        screenshot_under_load(page, run, shot)


def screenshot_under_load(page, run, path: str) -> None:
    """A second wave of requests, so the picture has pages owned in the
    tables and two bursts in the plots."""
    load = [threading.Thread(target=run, args=(key,)) for key in ["sk-alpha-test", "sk-beta-test"] * 3]
    for t in load:
        t.start()
    try:
        wait_until("pages owned", lambda: sum(column(page, "pools", "owned")) > 0)
        page.screenshot(path=path, full_page=True)
    finally:
        for t in load:
            t.join(timeout=120)
