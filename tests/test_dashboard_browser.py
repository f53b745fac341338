"""The dashboard as an operator sees it: a real browser on a real fleet ("A fleet dashboard").

`dfl-node testbed` runs 4 daemons in round mode; headless Debian chromium, driven by Selenium through the system
chromedriver (never Selenium Manager: nothing is downloaded), opens node-0's page and must see the fleet live —
every node in the fleet table, the round advancing, the round token, the recent exchanges, a chart with real
ticks — follow a peer's link to that peer's own page, and stay readable 375 px wide. The screenshot it takes of
node-0's page is the README's (docs/dashboard.png, written when DFL_UPDATE_SCREENSHOT is set).

The fast test checks the page as served: self-contained (no external URL) and with the fleet table's hooks.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from dfl_node.api.app import create_app
from dfl_node.records.metrics import NodeMetrics
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import new_token, quiet_node_config, start_env

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[1]
README_SCREENSHOT = REPO / "docs" / "dashboard.png"
NODES = [f"node-{i}" for i in range(4)]
# More rounds than any machine plays while the test watches: the fleet is still running when the test has seen
# what it needs, however fast it trains, and the test stops it then.
TESTBED_ARGS = ["--nodes", "4", "--mode", "round", "--rounds", "1000000", "--timeout", "600"]
WAIT_S = 60


# ----------------------------------------------------------------------------- fast: the page as served


class _Attributes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []  # every src and href value
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.links.append(value)
            if name == "id" and value:
                self.ids.add(value)


async def test_served_dashboard_is_self_contained_and_has_the_fleet_hooks() -> None:
    def never(*_: Any) -> Any:
        raise AssertionError("the page itself needs no provider")

    class Unread:  # a ServedNode the page itself reads nothing of
        metrics = NodeMetrics("node-0", never)
        status = history = fleet = staticmethod(never)

        async def committed_model(self) -> None:
            never()

    app = create_app(Unread())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
        response = await client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    html = response.text
    parsed = _Attributes()
    parsed.feed(html)
    assert all(not re.match(r"\s*(https?:|//|data:|javascript:)", link, re.I) for link in parsed.links), parsed.links
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "//cdn" not in html and "@import" not in html and "url(" not in html
    # data only ever goes in as text: no HTML built from strings
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", html)
    # the hooks the browser test (and any scraper) relies on
    assert {"fleet-table", "token", "recent-table", "chart", "node-id", "error"} <= parsed.ids
    assert "dataset.nodeId" in html and '"peer-link"' in html
    assert '"fleet"' in html and '"status"' in html and "POLL_MS = 2000" in html


# ----------------------------------------------------------------------------- the testbed


def serving(url: str) -> bool:
    """The node's REST API answers (the testbed prints the URLs before its daemons listen)."""
    try:
        return httpx.get(url + "healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class FleetRun:
    """`dfl-node testbed` in a process group of its own (its daemons are in it too), its stdout drained."""

    def __init__(self, workdir: Path, tmp: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
        env.update(TMPDIR=str(tmp), COLUMNS="200", PYTHONUNBUFFERED="1", DFL_THREADS="1")
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dfl_node", "testbed", *TESTBED_ARGS, "--workdir", str(workdir)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self.workdir = workdir

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:  # read to the end: a full pipe would stall the testbed's live table
            self.lines.append(line.rstrip("\n"))

    def output(self, last: int = 40) -> str:
        logs = "\n".join(f"--- {log.name} ---\n" + "\n".join(log.read_text().splitlines()[-10:])
                         for log in sorted(self.workdir.glob("**/node-*.log")))
        return "\n".join(["--- testbed output ---", *self.lines[-last:], logs])

    def dashboards(self, timeout: float) -> dict[str, str]:
        """The node → dashboard URL lines it prints at start (``  node-0  http://127.0.0.1:40121/``), once each
        node answers there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            urls = dict(m.groups() for line in list(self.lines) if (m := re.fullmatch(r"  (node-\d+)  (http://\S+/)",
                                                                                          line)))
            if sorted(urls) == NODES and all(serving(url) for url in urls.values()):
                return urls
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"no dashboard answering at a printed URL for each of {NODES}\n{self.output()}")

    def stop(self) -> None:
        """SIGTERM to the whole group (testbed and daemons), SIGKILL to whatever is left after a grace."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # daemons the testbed left, if any
        self.process.wait(timeout=10)
        self._reader.join(timeout=10)


@contextlib.contextmanager
def running_testbed(tmp_path: Path) -> Iterator[FleetRun]:
    (tmp_path / "tmp").mkdir()
    bed = FleetRun(tmp_path / "work", tmp_path / "tmp")
    try:
        yield bed
    finally:
        bed.stop()


# ----------------------------------------------------------------------------- the browser


def require_browser() -> None:
    """Fail, not skip: CI installs both (.ci/install-browser-and-promtool), and a missing one must show."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not (p.is_file() and os.access(p, os.X_OK))]
    if missing:
        pytest.fail(f"the dashboard's browser test needs Debian's chromium and chromedriver: {', '.join(missing)} "
                    "missing (install them with .ci/install-browser-and-promtool, or apt-get install chromium "
                    "chromium-driver)", pytrace=False)


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars",
                "--window-size=1200,900", "--force-device-scale-factor=1", f"--user-data-dir={profile}",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--lang=en-US"):
        options.add_argument(arg)
    # A driver path given: Selenium Manager is never consulted (it would download a driver and a browser).
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


# One read of the fleet table as the page shows it (the page re-renders it every 2 s: read it in one go).
READ_FLEET = """
return Array.from(document.querySelectorAll('#fleet-table tbody tr[data-node-id]')).map(tr => {
  const link = tr.querySelector('a.peer-link');
  return {id: tr.dataset.nodeId, round: tr.querySelector('td.round').textContent, self: tr.classList.contains('self'),
          href: link ? link.href : null, text: tr.textContent};
});
"""

READ_PAGE = """
const q = s => document.querySelector(s);
const lines = Array.from(document.querySelectorAll('#chart polyline'));
return {nodeId: q('#node-id').textContent, token: q('#token').textContent, error: q('#error').textContent,
        recent: Array.from(document.querySelectorAll('#recent-table tbody tr[data-event]')).map(tr => tr.dataset.event),
        ticks: Array.from(document.querySelectorAll('#chart text.x-tick')).map(t => t.textContent),
        xLabel: (q('#chart text.x-label') || {}).textContent, lines: lines.length,
        points: lines.length ? Math.min(...lines.map(p => p.getAttribute('points').split(' ').length)) : 0};
"""

READ_NODE = """
const rows = {};
document.querySelectorAll('#node-table tr').forEach(tr => {
  rows[tr.querySelector('th').textContent] = tr.querySelector('td').textContent;
});
return rows['samples (train + val)'] ? rows : null;
"""

READ_LAYOUT = """
const box = s => document.querySelector(s).getBoundingClientRect();
return {viewport: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
        wrapper: document.querySelector('#fleet-table').parentElement.getBoundingClientRect().right,
        chart: box('#chart').right};
"""


def wait_until(driver: Any, what: str, condition: Callable[[Any], Any], bed: FleetRun, timeout: float = WAIT_S) -> Any:
    """``condition(driver)`` once it is truthy (WebDriverWait: no fixed sleeps); at the deadline, fail with what
    the page and the fleet said."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException]).until(condition)
    except TimeoutException:
        page = driver.execute_script(READ_PAGE)
        fleet = driver.execute_script(READ_FLEET)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\npage: {page}\nfleet: {fleet}\n{bed.output()}")


def own_round(driver: Any) -> int | None:
    rows = [r for r in driver.execute_script(READ_FLEET) if r["self"]]
    return int(rows[0]["round"]) if rows and rows[0]["round"].isdigit() else None


def viewport(driver: Any, width: int, height: int, *, mobile: bool = False) -> None:
    """Lay the page out in a ``width`` x ``height`` viewport (a phone's, with ``mobile``), whatever the window."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                                   "deviceScaleFactor": 1, "mobile": mobile})


def assert_not_blank(png: bytes, width: int, height: int) -> None:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (width, height), image.size
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, f"{len(colours)} distinct colours: a blank page?"
    background = max(colours)[1]
    ink = sum(count for count, colour in colours if sum(abs(a - b) for a, b in zip(colour, background)) > 60)
    assert ink > 0.01 * width * height, f"only {ink} pixels differ from the background {background}"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dashboard_shows_the_live_fleet_and_links_to_each_peer(tmp_path: Path) -> None:
    require_browser()
    profile = tmp_path / "chromium-profile"
    with running_testbed(tmp_path) as bed, chromium(profile) as driver:
        urls = bed.dashboards(timeout=WAIT_S)
        driver.get(urls["node-0"])

        # every node of the fleet, each peer linked to its own dashboard at the URL the testbed printed
        def fleet_linked(d: Any) -> list[dict] | None:
            rows = d.execute_script(READ_FLEET)
            return rows if [r["id"] for r in rows] == NODES and all(r["self"] or r["href"] for r in rows) else None

        rows = wait_until(driver, "the fleet table to list all 4 nodes, peers linked", fleet_linked, bed)
        assert [r["self"] for r in rows] == [True, False, False, False]  # this node first
        assert rows[0]["href"] is None and "this node" in rows[0]["text"]
        assert {r["id"]: r["href"] for r in rows[1:]} == {node: urls[node] for node in NODES[1:]}

        # live: the round this node shows advances while the page is open
        first = wait_until(driver, "node-0's round", lambda d: (r := own_round(d)) is not None and [r], bed)[0]
        wait_until(driver, f"node-0's round to advance past {first}",
                   lambda d: (r := own_round(d)) is not None and r > first, bed)

        # the round token, the recent exchanges, and a chart with real round ticks (and points to draw)
        page = wait_until(driver, "the token, recent exchanges and a drawn chart", lambda d: (
            p := d.execute_script(READ_PAGE))["lines"] == 2 and p["points"] >= 8 and len(p["ticks"]) >= 2
            and p["recent"] and re.fullmatch(r"token: node-\d, held [\d.]+ s \(epoch \d+\)", p["token"]) and p, bed)
        assert page["nodeId"] == "node-0" and page["error"] == ""
        assert set(page["recent"]) <= {"send", "fusion", "refusal"}
        assert page["xLabel"] == "round" and all(t.isdigit() for t in page["ticks"]), page
        assert [int(t) for t in page["ticks"]] == sorted(int(t) for t in page["ticks"])

        # the node's own data: its samples, and when they last changed (docs/data.md)
        node = wait_until(driver, "the node's data in its table", lambda d: d.execute_script(READ_NODE), bed)
        assert re.fullmatch(r"\d+ \+ \d+", node["samples (train + val)"]), node
        assert node["data changed"].startswith("at start, ") and node["bad data files"] == "none", node

        # the README's screenshot: node-0's page, a 1200x900 viewport (the window's is smaller: headless
        # chromium draws a window frame), not blank
        viewport(driver, 1200, 900)
        png = driver.get_screenshot_as_png()
        assert_not_blank(png, 1200, 900)
        (tmp_path / "dashboard.png").write_bytes(png)
        if os.environ.get("DFL_UPDATE_SCREENSHOT"):  # only when asked: every run's picture differs (ids, times)
            README_SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copyfile(tmp_path / "dashboard.png", README_SCREENSHOT)

        # a phone, 375 px wide: nothing makes the page scroll sideways (tables scroll inside their wrappers)
        viewport(driver, 375, 812, mobile=True)
        layout = wait_until(driver, "the page to lay out 375 px wide",
                            lambda d: (lay := d.execute_script(READ_LAYOUT))["viewport"] == 375 and lay, bed)
        assert layout["page"] <= 375 and layout["wrapper"] <= 375 and layout["chart"] <= 375, layout
        driver.save_screenshot(str(tmp_path / "dashboard-375px.png"))
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

        # a click on a peer's link opens that peer's own page
        def click_peer(d: Any) -> bool:
            d.find_element("css selector", '#fleet-table tr[data-node-id="node-2"] a.peer-link').click()
            return True

        wait_until(driver, "a click on node-2's link", click_peer, bed)
        wait_until(driver, "node-2's own dashboard", lambda d: d.execute_script(
            "return document.querySelector('#node-id').textContent") == "node-2", bed)
        assert driver.current_url == urls["node-2"]
        wait_until(driver, "node-2's page to show itself as this node",
                   lambda d: [r["id"] for r in d.execute_script(READ_FLEET) if r["self"]] == ["node-2"], bed)
        assert bed.process.poll() is None, "the fleet stopped before the test was done: raise --rounds\n" + bed.output()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dashboard_asks_for_the_rest_token_once(fleet_shards: Path, tmp_path: Path) -> None:
    """A node started with --http-token-file: its page asks for the token, then shows the node; a reload does not
    ask again; a wrong token asks again."""
    from selenium.webdriver.support.ui import WebDriverWait

    require_browser()
    token_file = new_token(tmp_path / "http.token")
    config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=free_port(), http_token_file=token_file)
    url = f"http://127.0.0.1:{config.api.http_port}/"
    log = (tmp_path / "node.log").open("w")
    node = subprocess.Popen([sys.executable, "-m", "dfl_node", "start"], env=start_env(config), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while not serving(url):
            assert node.poll() is None and time.monotonic() < deadline, (tmp_path / "node.log").read_text()[-3000:]
            time.sleep(0.1)
        with chromium(tmp_path / "chromium-profile") as driver:
            def until_page_shows(what: str, condition: Callable[[Any], Any]) -> Any:
                return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(condition, f"waiting for {what}")

            login_shown = "return !document.querySelector('#login').hidden"
            node_shown = ("return document.querySelector('#node-id').textContent === 'node-0' && "
                          "document.querySelector('#login').hidden")
            driver.get(url)
            until_page_shows("the page to ask for the token", lambda d: d.execute_script(login_shown))
            assert driver.execute_script("return document.querySelector('#node-id').textContent") == "…"
            driver.find_element("css selector", "#login-token").send_keys(token_file.read_text().strip())
            driver.find_element("css selector", "#login button").click()
            until_page_shows("node-0's page", lambda d: d.execute_script(node_shown))
            until_page_shows("no error",
                             lambda d: d.execute_script("return document.querySelector('#error').textContent") == "")
            driver.refresh()  # asked once: the token is kept for this node's address
            until_page_shows("node-0's page after a reload", lambda d: d.execute_script(node_shown))
            driver.execute_script("localStorage.setItem('dfl-node REST token', 'not-the-token')")
            driver.refresh()
            until_page_shows("a wrong token to be asked again", lambda d: d.execute_script(login_shown))
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=30)
        log.close()
