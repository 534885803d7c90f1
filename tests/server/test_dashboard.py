"""``GET /v1/admin/stats`` (what the dashboard polls) and ``GET /dashboard``, over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import infera_core.server
from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for, sse_data
from infera_core.testing.upstream import fake_upstreams, record_for
from infera_core.util.net import free_port
from infera_core.worker import Status

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle, start_sim

from infera_core.testing.fleet import stop_process

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimHandle]]:
    with (
        start_sim(model=MODEL, speedup="inf", block_size=16) as a,
        start_sim(model=MODEL, speedup="inf") as b,
    ):
        yield [a, b]


@contextlib.asynccontextmanager
async def stack(sims: list[SimHandle], **settings: Any) -> AsyncIterator[RunningServer]:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy="kv-aware", **settings), hooks, kv=kv) as srv:
        for i, sim in enumerate(sims):
            srv.store.put(sim.record(f"sim{i}"))
        await srv.wait_workers(len(sims))
        yield srv


async def traffic(c: httpx.AsyncClient, n: int, headers: dict[str, str] | None = None) -> None:
    for i in range(n):
        body = {"model": MODEL, "prompt": f"shared prefix {'lorem ' * 40} question {i}", "max_tokens": 4}
        if i % 2:
            body["stream"] = True
        r = await c.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text


async def test_stats_show_the_fleet_traffic_and_engines(sims: list[SimHandle]) -> None:
    async with stack(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        await traffic(c, 6)
        assert (await c.post("/v1/completions", json={"model": MODEL})).status_code == 400

        async def stats() -> dict[str, Any]:
            r = await c.get("/v1/admin/stats")
            assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
            body: dict[str, Any] = r.json()
            return body

        first = await stats()
        workers = {w["worker_id"]: w for w in first["workers"]}
        assert set(workers) == {"sim0", "sim1"}
        assert {(w["model"], w["role"], w["status"], w["breaker"]) for w in workers.values()} == {
            (MODEL, "mixed", "active", "closed")
        }
        assert sum(w["picks"] for w in workers.values()) == 6
        ok = sum(r["count"] for r in first["requests"] if r["status"] == "200")
        bad = [r for r in first["requests"] if r["status"] == "400"]
        assert ok == 6 and bad and bad[0]["route"] == "/v1/completions"
        h = first["histograms"]
        assert sum(h["ttft"]["series"][MODEL]["counts"]) == 3  # the streamed half
        assert len(h["ttft"]["series"][MODEL]["counts"]) == len(h["ttft"]["bounds"]) + 1
        assert sum(sum(s["counts"]) for s in h["decision"]["series"].values()) == 6
        assert first["usage"] is None  # no --api-key-file
        assert sum(t["count"] for t in first["tokens"] if t["kind"] == "completion") == 12  # non-streamed

        # the KV mirror and the engines' own numbers arrive in the background
        latest: dict[str, Any] = {}

        async def mirrored() -> bool:
            latest.update(await stats())
            rows = latest["workers"]
            # a hit rate once the engine had queries: the picked workers (kv-aware may pick one)
            return any(w.get("kv_blocks") for w in rows) and all(
                "running" in w["engine_stats"] and ("hit_rate" in w["engine_stats"] or not w["picks"])
                for w in rows
            )

        async with asyncio.timeout(40):
            while not await mirrored():  # noqa: ASYNC110 (state in other processes)
                await asyncio.sleep(0.2)
        for w in latest["workers"]:
            assert w["kv_stale"] is False and w["engine_stats"]["running"] == 0
            assert 0 <= w["engine_stats"].get("hit_rate", 0) <= 1


async def test_page_is_one_self_contained_file(sims: list[SimHandle]) -> None:
    async with stack(sims[:1]) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.get("/dashboard")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        page = r.text
    assert "/v1/admin/stats" in page and "<script>" in page and "<style>" in page
    # nothing loaded from elsewhere: no external script, stylesheet, image or font
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", page)
    assert not re.search(r"https?://|url\(|@import", page)
    assert (Path(infera_core.server.__file__).parent / "static/dashboard.html").read_text() == page


async def test_admin_pages_carry_browser_security_headers(sims: list[SimHandle]) -> None:
    """Issue #28 row 17: CSP, X-Frame-Options and nosniff on the dashboard and /v1/admin/*;
    the page's CSP allows its own inline script and style (by hash) and nothing else."""
    async with stack(sims[:1], admin_token="tok") as srv, httpx.AsyncClient(base_url=srv.url) as c:
        ok = {"Authorization": "Bearer tok"}
        answers = {
            "/dashboard": await c.get("/dashboard"),
            "/v1/admin/stats": await c.get("/v1/admin/stats", headers=ok),
            "/v1/admin/stats 401": await c.get("/v1/admin/stats"),
            "/v1/admin/usage": await c.get("/v1/admin/usage", headers=ok),
            "/v1/workers": await c.get("/v1/workers", headers=ok),
        }
        chat = await c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
    for route, r in answers.items():
        assert r.headers.get("x-content-type-options") == "nosniff", route
        assert r.headers.get("x-frame-options") == "DENY", route
        csp = r.headers.get("content-security-policy", "")
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, route
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, route
    page_csp = answers["/dashboard"].headers["content-security-policy"]
    assert "script-src 'sha256-" in page_csp and "style-src 'sha256-" in page_csp
    assert "connect-src 'self'" in page_csp
    assert answers["/dashboard"].headers.get_list("content-security-policy") == [page_csp]  # one policy
    assert "content-security-policy" not in chat.headers  # the inference routes stay lean


async def test_stats_count_tokens_per_api_key(sims: list[SimHandle], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - name: team-a\n    key: sk-team-a\n")
    async with stack(sims[:1], api_key_file=str(keys)) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        await traffic(c, 2, headers={"Authorization": "Bearer sk-team-a"})
        usage = (await c.get("/v1/admin/stats")).json()["usage"]
        metrics = (await c.get("/metrics")).text
    [team] = [k for k in usage if k["key"] == "team-a"]
    spent = team["models_used"][MODEL]
    assert spent["requests"] == 2
    assert spent["completion_tokens"] == 8
    # the second prompt shares the first's prefix: the tenant's prefix-cache hits, as the engine reported
    assert 0 < spent["cached_tokens"] < spent["prompt_tokens"]
    assert (
        f'infera_key_cached_tokens_total{{key="team-a",model="{MODEL}"}} {spent["cached_tokens"]}.0'
        in metrics
    )


async def test_dashboard_in_chromium_shows_each_tenants_prefix_cache_hits(
    sims: list[SimHandle], browser: Any, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - name: team-a\n    key: sk-team-a\n  - name: team-b\n    key: sk-team-b\n")
    async with (
        stack(sims[:1], api_key_file=str(keys)) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=20) as c,
    ):
        await traffic(c, 2, headers={"Authorization": "Bearer sk-team-a"})
        body = {"model": MODEL, "prompt": "team b's own words", "max_tokens": 1}
        r = await c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-team-b"})
        assert r.status_code == 200, r.text
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")

        def hits(d: Any) -> dict[str, str]:
            rows = d.find_element("id", "usage-table").find_elements("css selector", "tr")[1:]
            cells = [[td.text for td in row.find_elements("css selector", "td")] for row in rows]
            return {c[0]: c[5] for c in cells if len(c) > 5}

        await in_browser(browser, lambda d: set(hits(d)) == {"team-a", "team-b"})
        shown = hits(browser)
        assert shown["team-b"] == "0%" and shown["team-a"].endswith("%") and shown["team-a"] != "0%", shown


def _lan_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


async def test_admin_rule_loopback_only_without_a_token(sims: list[SimHandle]) -> None:
    lan = _lan_address()
    if lan is None:
        pytest.skip("no non-loopback address on this machine")
    port = free_port()
    async with stack(sims[:1], host="0.0.0.0", port=port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as local:
            assert (await local.get("/dashboard")).status_code == 200
            assert (await local.get("/v1/admin/stats")).status_code == 200
        async with httpx.AsyncClient(base_url=f"http://{lan}:{port}") as remote:
            for route in ("/dashboard", "/v1/admin/stats"):
                r = await remote.get(route)
                assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only", route


async def test_with_an_admin_token_the_data_needs_it(sims: list[SimHandle]) -> None:
    async with stack(sims[:1], admin_token="tok-123") as srv, httpx.AsyncClient(base_url=srv.url) as c:
        assert (await c.get("/v1/admin/stats")).status_code == 401
        ok = await c.get("/v1/admin/stats", headers={"Authorization": "Bearer tok-123"})
        assert ok.status_code == 200 and ok.json()["workers"]
        # the page holds no data; a browser cannot send the token on a page load, so it asks
        page = await c.get("/dashboard")
        assert page.status_code == 200 and "Admin token" in page.text


# -- in a real browser (Debian chromium + chromium-driver, driven by selenium) ----------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1500,1000",
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver here: apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (requirements-dev)"
    )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP refusals are logged there
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


async def in_browser(driver: Any, predicate: Callable[[Any], Any], within: float = 30) -> Any:
    """Wait (in a thread: the server runs on this event loop) until ``predicate(driver)`` is truthy."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(
        driver, within, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
    )
    return await asyncio.to_thread(wait.until, predicate)


def cell(driver: Any, worker: str, cls: str) -> str | None:
    """The text of one fleet-table cell (the page re-renders the table every second)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(10):
        found = driver.find_elements("css selector", f'tr[data-worker="{worker}"] td.{cls}')
        try:
            return str(found[0].text) if found else None
        except StaleElementReferenceException:
            continue  # replaced between the lookup and the read: look it up again
    raise AssertionError(f"the {worker} row never held still")


async def test_dashboard_in_chromium_shows_the_fleet_and_a_drain(
    sims: list[SimHandle], browser: Any, tmp_path: Path
) -> None:
    async with stack(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")
        await in_browser(
            browser, lambda d: cell(d, "sim0", "status") == "active" == cell(d, "sim1", "status")
        )
        assert browser.find_element("id", "state").text == "live"
        assert browser.find_element("id", "sum-workers").text == "2 / 2"
        # traffic: the page turns two polls into rates and windowed percentiles
        polls = int(browser.find_element("id", "updated").get_attribute("data-polls"))
        await traffic(c, 10)
        await in_browser(
            browser, lambda d: int(d.find_element("id", "updated").get_attribute("data-polls")) > polls
        )
        await in_browser(browser, lambda d: d.find_element("id", "sum-rps").text not in ("–", "0.0"))
        await in_browser(browser, lambda d: "/v1/completions" in d.find_element("id", "latency-table").text)
        await in_browser(browser, lambda d: (cell(d, "sim0", "hitrate") or "–").endswith("%"))  # from sim0

        # sim1 starts draining (its launcher re-registers it as draining): the page follows
        srv.store.put(sims[1].record("sim1", status=Status.DRAINING))
        await in_browser(browser, lambda d: cell(d, "sim1", "status") == "draining")
        assert browser.find_element("id", "sum-workers").text == "1 / 2"
        assert cell(browser, "sim0", "status") == "active"
        # the page works under its own Content-Security-Policy: nothing it runs was refused
        refused = [
            e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]
        ]
        assert not refused, refused
        shot = Path(os.environ.get("INFERA_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
        assert await asyncio.to_thread(browser.save_screenshot, str(shot))


async def test_dashboard_in_chromium_shows_the_last_routing_decisions(
    sims: list[SimHandle], browser: Any
) -> None:
    """A request sent with X-Infera-Explain: its decision (policy, pick, score) is on the page."""
    async with stack(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")
        await in_browser(browser, lambda d: "nothing yet" in d.find_element("id", "last-decisions").text)
        body = {"model": MODEL, "prompt": "explain this pick", "max_tokens": 2}
        r = await c.post("/v1/completions", json=body, headers={"X-Infera-Explain": "1"})
        picked = r.headers["x-infera-worker"]
        kept = (await c.get("/v1/admin/stats")).json()["last_decisions"]
        assert kept[0]["picked"] == picked and kept[0]["status"] == 200
        text = await in_browser(
            browser,
            lambda d: (t := d.find_element("id", "last-decisions-table").text) and picked in t and t,
        )
        assert "kv-aware" in text and MODEL in text


async def test_dashboard_in_chromium_shows_each_models_routing_mode(
    sims: list[SimHandle], browser: Any
) -> None:
    """A model the router has no tokenizer for is shown as routed by text prefix, not hidden."""
    async with stack(sims[:1]) as srv:
        rec = sims[1].record("plain0", model="plain-model")
        assert rec.kv_events is not None
        kv = rec.kv_events.model_copy(update={"fingerprint": None})  # names no tokenizer
        srv.store.put(rec.model_copy(update={"kv_events": kv}))
        await srv.wait_workers(2)
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")

        def badge(d: Any, model: str) -> tuple[str, str] | None:
            from selenium.common.exceptions import StaleElementReferenceException

            found = d.find_elements("css selector", f'span.routing-mode[data-model="{model}"]')
            try:
                return (str(found[0].text), str(found[0].get_attribute("class"))) if found else None
            except StaleElementReferenceException:  # the page re-rendered meanwhile: look again
                return None

        want = {
            "plain-model": ("routed by text prefix", "pill routing-mode text"),
            MODEL: ("routed by tokens", "pill routing-mode tokens"),
        }
        await in_browser(browser, lambda d: all(badge(d, m) == shown for m, shown in want.items()))


async def test_dashboard_in_chromium_asks_for_the_admin_token(sims: list[SimHandle], browser: Any) -> None:
    async with stack(sims[:1], admin_token="tok-browser") as srv:
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")
        await in_browser(browser, lambda d: d.find_element("id", "auth").is_displayed())
        assert cell(browser, "sim0", "status") is None  # no data without the token

        def enter_token() -> None:
            browser.find_element("id", "token").send_keys("tok-browser")
            browser.find_element("css selector", "#auth button").click()

        await asyncio.to_thread(enter_token)
        await in_browser(browser, lambda d: cell(d, "sim0", "status") == "active")


@pytest.mark.slow
def test_up_prints_the_dashboard_url_and_the_page_sees_its_workers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infera_core", "up", "--port", "0", "--workers", "2", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]  # bounded: the test timeout
        assert lines[0].startswith("Infera ready: "), lines
        m = re.fullmatch(r"Dashboard: (http://127\.0\.0\.1:\d+/dashboard)\n", lines[1])
        assert m, lines
        url = m.group(1)
        assert "/v1/admin/stats" in httpx.get(url, timeout=10).text
        stats = httpx.get(url.replace("/dashboard", "/v1/admin/stats"), timeout=10).json()
        assert sorted(w["status"] for w in stats["workers"]) == ["active", "active"]
    finally:
        stop_process(proc, within=60)


async def test_dashboard_in_chromium_shows_streams_continued_elsewhere(browser: Any) -> None:
    async with fake_upstreams(2) as ups, serving(settings_for(), make_hooks()) as srv:
        for u in ups:
            srv.store.put(record_for(u))
        await srv.wait_workers(2)
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")
        await in_browser(browser, lambda d: "no stream broke" in d.find_element("id", "migrations").text)
        ups[0].die_after_chunks = 3  # w0's streams break mid-way: each continues on w1
        async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            for _ in range(2):  # round-robin: one of them starts on w0
                assert (await sse_data(c, "/v1/chat/completions", body))[-1] == "data: [DONE]"
        await in_browser(
            browser, lambda d: "upstream_closed resumed" in d.find_element("id", "migrations").text
        )
        text = browser.find_element("id", "migrations").text
        assert "resume fake-model p50 / p99" in text


async def test_dashboard_in_chromium_shows_the_router_queue(sims: list[SimHandle], browser: Any) -> None:
    """Requests that waited in the router queue show as a row per model and tier."""
    async with (
        stack(sims, max_inflight_per_worker=1) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=20) as c,
    ):
        await asyncio.to_thread(browser.get, srv.url + "/dashboard")
        await in_browser(browser, lambda d: "nothing has queued" in d.find_element("id", "queue").text)
        body = {"model": MODEL, "prompt": "queued", "max_tokens": 4}
        results = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(8)))
        assert [r.status_code for r in results] == [200] * 8
        stats = (await c.get("/v1/admin/stats")).json()
        assert "|".join((MODEL, "standard")) in stats["histograms"]["queue_wait"]["series"]
        await in_browser(browser, lambda d: "standard" in d.find_element("id", "queue").text)
        row = browser.find_element("css selector", f'tr[data-queue="{MODEL}|standard"]')
        assert row.find_element("css selector", "td.depth").text == "0"
