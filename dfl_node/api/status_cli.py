"""``dfl-node status [URL] [--all] [--json]``: show what a running node (or its neighbourhood) reports.

The CLI module wires the click command to :func:`show_status`, which returns the process exit code.

Responses are handled as plain dicts rather than validated :class:`~dfl_node.records.status.NodeStatus`
objects, so a status client of one version can still show nodes of another (missing fields print
as "–"). HTTP is blocking ``httpx``; ``--all`` queries the peers from a small thread pool, which
keeps :func:`show_status` callable from anywhere, including code that already runs an event loop.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape

from dfl_node.api.client import rest_client
from dfl_node.api.status_tables import fleet_table, node_table, peer_table, refused_table
from dfl_node.records.urls import normalize_url, peer_url

__all__ = ["fetch_status", "show_status"]

DEFAULT_URL = "http://127.0.0.1:8080"
PEER_TIMEOUT_S = 2.0


class StatusError(Exception):
    """A node could not be queried. ``str()`` is the full message; ``reason`` omits the URL."""

    def __init__(self, url: str, reason: str, prefix: str = "cannot reach") -> None:
        super().__init__(f"{prefix} {url}: {reason}")
        self.url = url
        self.reason = reason


def fetch_status(client: httpx.Client, base_url: str) -> dict[str, Any]:
    """``GET {base_url}/status`` as a dict; raises :class:`StatusError` with a readable reason."""
    try:
        resp = client.get(base_url + "/status")
    except httpx.TimeoutException:
        raise StatusError(base_url, "timed out") from None
    except httpx.HTTPError as exc:  # connection refused, DNS, protocol errors
        raise StatusError(base_url, str(exc) or type(exc).__name__) from None
    except (httpx.InvalidURL, ValueError) as exc:  # malformed URLs (InvalidURL is no HTTPError)
        raise StatusError(base_url, f"invalid URL ({exc})") from None
    if resp.status_code == 401:
        raise StatusError(base_url, "/status needs the node's REST token (--http-token-file, DFL_HTTP_TOKEN_FILE), "
                          "and this one was refused" if "authorization" in client.headers else
                          "/status needs the node's REST token: give --http-token-file (or DFL_HTTP_TOKEN_FILE)",
                          "refused by")
    if resp.status_code != 200:
        reason = f"/status answered HTTP {resp.status_code} (is this a dfl-node?)"
        raise StatusError(base_url, reason, "bad answer from")
    try:
        data = resp.json()
    except ValueError:
        raise StatusError(base_url, "/status did not return JSON (is this a dfl-node?)", "bad answer from") from None
    if not isinstance(data, dict) or "id" not in data:
        raise StatusError(base_url, "/status is not a dfl-node status (is this a dfl-node?)", "bad answer from")
    return data


# ---------------------------------------------------------------------------------------------- main


def _gather_fleet(client: httpx.Client, base_url: str, root: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for the queried node and each of its peers (one hop), peers queried concurrently: those in its table,
    and those refused at Hello that said they are of its swarm (a device with other data is part of the fleet an
    operator looks at)."""
    rows: list[dict[str, Any]] = [{"id": root.get("id"), "url": base_url, "status": root, "error": None}]
    targets: list[tuple[dict[str, Any], str | None]] = []
    seen = {root.get("id")}
    refused = [r for r in root.get("refused_peers") or []
               if isinstance(r, dict) and r.get("reason") not in ("protocol_version", "swarm_mismatch")]
    for p in sorted([*(root.get("peers") or []), *refused], key=lambda p: str(p.get("id"))):
        if p.get("id") in seen:
            continue
        seen.add(p.get("id"))
        targets.append((p, peer_url(p, base_url)))

    def query(target: tuple[dict[str, Any], str | None]) -> dict[str, Any]:
        peer, url = target
        row: dict[str, Any] = {"id": peer.get("id"), "url": url, "status": None, "error": None}
        if url is None:
            row["error"] = "peer announced no HTTP port"
            return row
        try:
            row["status"] = fetch_status(client, url)
        except StatusError as exc:
            row["error"] = exc.reason
        return row

    if targets:
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            rows.extend(pool.map(query, targets))
    return rows


def show_status(
    url: str = DEFAULT_URL,
    all_peers: bool = False,
    as_json: bool = False,
    timeout: float = 3.0,
    *,
    wide: bool = False,
    watch: float | None = None,
    repeats: int | None = None,
    wait_done: float | None = None,
    headers: dict[str, str] | None = None,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Print the status of the node at ``url`` (and with ``all_peers`` of its peers); return the exit code.
    With ``watch``, print it again every ``watch`` seconds (``repeats`` times, or until Ctrl-C). With
    ``wait_done``, first wait up to that many seconds until every node to be shown answers and is done (a script
    that starts a fleet then asks for its result needs no sleep of its own), and exit 1 if they are not. ``headers``:
    sent to every node (the fleet's REST token).

    Exit code 0 when every node shown answered; 1 if the node at ``url`` cannot be queried (the reason goes
    to stderr) or, with ``all_peers``, any peer it knows cannot: a script polling the fleet sees it.
    """
    out = console or Console(soft_wrap=False)
    err = err_console or Console(stderr=True)
    base_url, code, shown = normalize_url(url), 0, 0
    if wait_done is not None and not _wait_until_done(base_url, all_peers, timeout, wait_done, headers or {}):
        _show_once(base_url, all_peers, as_json, timeout, wide, out, err, headers or {})
        err.print(f"[red]error:[/] not done after {wait_done:g} s", highlight=False)
        return 1
    try:
        while True:
            if watch is not None and out.is_terminal:
                out.clear()
            code = _show_once(base_url, all_peers, as_json, timeout, wide, out, err, headers or {})
            shown += 1
            if watch is None or (repeats is not None and shown >= repeats):
                return code
            time.sleep(watch)
    except KeyboardInterrupt:
        return code


def _wait_until_done(base_url: str, all_peers: bool, timeout: float, seconds: float, headers: dict[str, str],
                     every: float = 0.5) -> bool:
    """Poll until the node (with ``all_peers``, every node of the fleet it lists) answers and is done, for at most
    ``seconds``; whether it came to that. A node that does not answer yet (still starting) is simply asked again."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with rest_client(min(timeout, PEER_TIMEOUT_S), headers) as client:
                root = fetch_status(client, base_url)
                rows = _gather_fleet(client, base_url, root) if all_peers else [{"status": root}]
            if all(r["status"] is not None and r["status"].get("done") for r in rows):
                return True
        except StatusError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


def _show_once(base_url: str, all_peers: bool, as_json: bool, timeout: float, wide: bool, out: Console,
               err: Console, headers: dict[str, str]) -> int:
    try:
        with rest_client(timeout, headers) as client:
            root = fetch_status(client, base_url)
            if not all_peers:
                if as_json:
                    out.file.write(json.dumps(root, indent=2) + "\n")
                else:
                    out.print(node_table(root, base_url))
                    if root.get("peers"):
                        out.print(peer_table(root))
                    _print_refused(out, [root])
                return 0
            client.timeout = httpx.Timeout(min(timeout, PEER_TIMEOUT_S))
            rows = _gather_fleet(client, base_url, root)
    except StatusError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 1

    if as_json:
        payload = [r["status"] if r["status"] is not None else
                   {"id": r["id"], "url": r["url"], "error": r["error"], "reachable": False} for r in rows]
        out.file.write(json.dumps(payload, indent=2) + "\n")
    else:
        out.print(fleet_table(rows, wide))
        _print_refused(out, [r["status"] for r in rows if r["status"] is not None])
    return 1 if any(r["status"] is None for r in rows) else 0


def _print_refused(out: Console, statuses: list[dict[str, Any]]) -> None:
    table = refused_table(statuses)
    if table is not None:
        out.print(table)
