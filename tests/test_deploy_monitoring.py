"""The monitoring files in deploy/: the Prometheus scrape configuration (deploy/prometheus/prometheus.yml) is
valid for promtool and scrapes exactly the Compose fleet's nodes on their REST port, and the Grafana dashboard
(deploy/grafana/dfl-node-dashboard.json) is well formed, its queries parse as PromQL, and they use only the
metric names a node exposes, by the book (counters and histogram series only inside rate()).

promtool comes with Prometheus (Debian: the `prometheus` package); without it these tests fail, not skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.helpers.deploy import COMPOSE, DEPLOY, ROOT, SHARED, in_readme
from tests.helpers.metric_names import COUNTERS, HISTOGRAMS, KNOWN, PROCESS_COUNTERS
from tests.helpers.nodes import new_token

PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dfl-node-dashboard.json"
COMPOSE_JOB = "dfl-compose"

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
METRIC = re.compile(r"(?<![\w:])(?:dfl|process)_[a-z0-9_]+")
RATED = re.compile(r"\b(?:rate|irate|increase)\(\s*$")  # what must come right before a counter's selector
RANGE = re.compile(r"\[(\d+)([smhd])\]")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DATASOURCE = "${DS_PROMETHEUS}"


def promtool(*args: str, check: bool = True) -> str:
    """Run promtool (fail if absent, or with ``check`` if it fails); its output."""
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: install Prometheus (Debian: apt-get install prometheus)")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 0 or not check, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def seconds(duration: str) -> int:
    """A Prometheus duration of one unit (``5s``, ``5m``) in seconds."""
    m = re.fullmatch(r"(\d+)([smhd])", duration)
    assert m, f"unexpected duration {duration!r}"
    return int(m.group(1)) * SECONDS[m.group(2)]


def uncommented_example(text: str) -> str:
    """The configuration with its commented hand-started-fleet example uncommented, as the file says: every
    ``  # `` line from the first commented ``- job_name:`` on loses its ``# ``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  # - job_name:"))
    tail = [re.sub(r"^  # ?", "  ", line) if line.startswith("  #") else line for line in lines[start:]]
    return "\n".join(lines[:start] + tail) + "\n"


# ----------------------------------------------------------------------------- Prometheus


def test_prometheus_config_passes_promtool() -> None:
    assert "SUCCESS" in promtool("check", "config", str(PROMETHEUS))


def test_commented_fleet_example_passes_promtool(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(uncommented_example(PROMETHEUS.read_text()))
    jobs = {job["job_name"]: job for job in yaml.safe_load(config.read_text())["scrape_configs"]}
    assert list(jobs)[0] == COMPOSE_JOB and "dfl-fleet" in list(jobs)[1:], jobs
    token = jobs["dfl-fleet"]["authorization"]["credentials_file"]  # the REST token, as the comment makes it
    assert "FAILED" in promtool("check", "config", str(config), check=False)  # promtool reads it: none yet
    new_token(tmp_path / token)
    assert "SUCCESS" in promtool("check", "config", str(config))


def compose_nodes() -> dict[str, tuple[str, str]]:
    """docker-compose.yml's node services (those with a DFL_ID) -> (published host:port of their REST port,
    the status URL they advertise)."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    nodes: dict[str, tuple[str, str]] = {}
    for name, service in services.items():
        env = service.get("environment") or {}
        if "DFL_ID" not in env:
            continue
        http_port = str(env.get("DFL_HTTP_PORT", SHARED["DFL_HTTP_PORT"]))
        published = []
        for port in service.get("ports", []):
            assert isinstance(port, str), f"{name}: long port syntax, teach this test to read it: {port!r}"
            *host, container_port = port.split(":")  # [[HOST_IP:]HOST_PORT:]CONTAINER_PORT[/PROTOCOL]
            if container_port.split("/")[0] != http_port:
                continue
            assert host, f"{name}: REST port {http_port} published on a random host port: {port!r}"
            host_ip = ":".join(host[:-1]) or "0.0.0.0"
            published.append(f"{'127.0.0.1' if host_ip == '0.0.0.0' else host_ip}:{host[-1]}")
        assert len(published) == 1, f"{name}: its REST port {http_port} is published {len(published)} times"
        nodes[name] = (published[0], env["DFL_STATUS_URL"])
    return nodes


def test_scrape_targets_are_the_compose_nodes() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == COMPOSE_JOB]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job.get("scheme", "http") == "http"  # the compose fleet's REST API is plain HTTP
    scraped: dict[str, str] = {}
    for group in job["static_configs"]:
        (target,) = group["targets"]  # one per group: each carries its own instance label
        scraped[group["labels"]["instance"]] = target
    nodes = compose_nodes()
    assert len(nodes) >= 2, nodes
    assert scraped == {name: published for name, (published, _) in nodes.items()}
    for name, (published, status_url) in nodes.items():  # the URL the node itself advertises as its status
        assert urlsplit(status_url).netloc == published, name


def test_scrape_interval_suits_the_dashboard_ranges() -> None:
    """Every range in the dashboard's queries spans at least four scrapes of every job (the example's too), so
    rate() always has samples to work with."""
    config = yaml.safe_load(uncommented_example(PROMETHEUS.read_text()))
    default = config["global"]["scrape_interval"]
    assert seconds(default) <= 15, "the testbed's rounds take seconds: scrape it at least every 15 s"
    longest = max(seconds(job.get("scrape_interval", default)) for job in config["scrape_configs"])
    ranges = {m.group(0) for expr in dashboard_exprs().values() for m in RANGE.finditer(expr)}
    assert ranges
    for window in ranges:
        assert seconds(window[1:-1]) >= 4 * longest, f"{window} spans fewer than 4 scrapes of {longest} s"


# ----------------------------------------------------------------------------- Grafana


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels (of collapsed rows) included."""
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(all_panels(panel.get("panels", [])))
    return out


def variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return query["query"] if isinstance(query, dict) else query


def dashboard_exprs() -> dict[str, str]:
    """Every PromQL expression of the dashboard: "panel title / refId" -> expr, and its query variables'."""
    board = dashboard()
    exprs = {f"{panel['title']} / {target['refId']}": target["expr"]
             for panel in all_panels(board["panels"]) for target in panel.get("targets", [])}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs[f"variable {variable['name']}"] = variable_query(variable)
    return exprs


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    node = variables["node"]
    assert node["type"] == "query" and node["datasource"]["uid"] == DATASOURCE
    assert re.fullmatch(r"label_values\(\s*dfl_info\s*,\s*node\s*\)", variable_query(node))

    panels = all_panels(board["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert all(isinstance(i, int) for i in ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        title, pos = panel["title"], panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, title
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{title!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = title
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{title!r} has no query"
        assert panel["datasource"]["uid"] == DATASOURCE, title
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE, title
            assert 'node=~"$node"' in target["expr"], f"{title!r} ignores the node variable: {target['expr']}"


def used_metrics(expr: str) -> list[tuple[int, str, str]]:
    """(position, name as written, base name) of each dfl_*/process_* metric in ``expr``: a histogram's
    _bucket/_sum/_count series count as the histogram."""
    out = []
    for m in METRIC.finditer(expr):
        name = m.group(0)
        base = name
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in HISTOGRAMS:
                base = name.removesuffix(suffix)
        out.append((m.start(), name, base))
    return out


def test_dashboard_uses_only_known_metrics() -> None:
    unknown = {where: name for where, expr in dashboard_exprs().items()
               for _, name, base in used_metrics(expr) if base not in KNOWN}
    assert not unknown, f"metrics a node does not expose: {unknown}"


def test_dashboard_shows_every_metric() -> None:
    """Each metric of the contract has a panel (a new metric needs one too, or this list a reason)."""
    used = {base for expr in dashboard_exprs().values() for _, _, base in used_metrics(expr)}
    assert KNOWN - used == set()


def test_dashboard_queries_by_the_book() -> None:
    """Counters and histogram series only as rate()'s (irate, increase) argument, gauges never there; histograms
    only as their series, their buckets only under histogram_quantile summed by le."""
    for where, expr in dashboard_exprs().items():
        for start, name, base in used_metrics(expr):
            rated = bool(RATED.search(expr[:start]))
            if base in HISTOGRAMS:
                assert name != base, f"{where}: histogram {base} used without _bucket/_sum/_count: {expr}"
                assert rated, f"{where}: {name} outside rate(): {expr}"
            elif name in COUNTERS | PROCESS_COUNTERS:
                assert rated, f"{where}: counter {name} outside rate(): {expr}"
            else:
                assert not rated, f"{where}: gauge {name} in rate(): {expr}"
        if "_bucket" in expr:
            assert expr.startswith("histogram_quantile("), f"{where}: {expr}"
            assert re.search(r"\bby \((?:[^)]*\W)?le\b", expr), f"{where}: buckets not summed by le: {expr}"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Each query, with the dashboard's variables filled in, is a valid recording rule for promtool: PromQL that
    Prometheus parses."""
    rules = []
    for i, (where, expr) in enumerate(dashboard_exprs().items()):
        if expr.startswith("label_values("):  # Grafana's variable query, not PromQL
            continue
        filled = re.sub(r"\$\{?node\}?", ".*", expr)
        assert "$" not in filled, f"{where}: an unknown variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": filled})
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert "SUCCESS" in promtool("check", "rules", str(path))


def test_readme_documents_them() -> None:
    in_readme([f"prometheus --config.file={PROMETHEUS.relative_to(ROOT)}",
               f"promtool check config {PROMETHEUS.relative_to(ROOT)}"])
    readme = (DEPLOY / "README.md").read_text()
    assert str(DASHBOARD.relative_to(ROOT)) in readme
    assert f"prometheus --config.file={PROMETHEUS.relative_to(ROOT)}" in PROMETHEUS.read_text()  # its header
