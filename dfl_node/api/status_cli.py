"""``dfl-node status [URL] [--all] [--json]``: show what a running node (or its neighbourhood) reports.

The CLI module wires the click command to :func:`show_status`, which returns the process exit code.

Responses are handled as plain dicts rather than validated :class:`~dfl_node.api.schemas.NodeStatus`
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
from rich.table import Table

from dfl_node.api.client import rest_client
from dfl_node.api.formatting import Figure, figure, format_bytes, format_data
from dfl_node.api.urls import normalize_url, peer_url

__all__ = ["fetch_status", "normalize_url", "peer_url", "show_status"]

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


# ---------------------------------------------------------------------------------------- formatting


def _dash(value: Any) -> str:
    """A value for a table cell: ``–`` for missing, rich markup in node-supplied text escaped."""
    return "–" if value is None else escape(str(value))


def _rejected(rejected: Any) -> str:
    if not rejected:
        return "0"
    total = sum(int(v) for v in rejected.values())
    parts = ", ".join(f"{escape(str(k))}: {v}" for k, v in sorted(rejected.items()))
    return f"{total} ({parts})"


def _alive(peers: Any) -> str:
    """``alive/known`` of a node's peer table."""
    peers = peers or []
    return f"{sum(1 for p in peers if p.get('alive'))}/{len(peers)}"


def _peers_summary(peers: Any) -> str:
    return f"{_alive(peers)} alive"


def _refusals(s: dict[str, Any]) -> str | None:
    """The peers refused at Hello, by reason (None: none): ``2 refused: node-4 (sample_shape_mismatch), …``."""
    refused = [r for r in s.get("refused_peers") or [] if isinstance(r, dict)]
    if not refused:
        return None
    named = sorted({f"{r.get('id')} ({r.get('reason')})" for r in refused})
    return f"{len({r.get('id') for r in refused})} refused: {', '.join(named)}"


def _state(s: dict[str, Any]) -> str:
    """done or ok, how peers reach it if not directly (behind NAT: relayed by whom, or unreachable), and what
    refusals at Hello made of the node: no compatible peer at all, or peers it lacks (the refused-at-hello table
    below says who and why)."""
    refused = {r.get("id") for r in s.get("refused_peers") or [] if isinstance(r, dict)}
    if refused and not any(p.get("alive") for p in s.get("peers") or []):
        return "[red]no compatible peer[/]"
    state = "[green]done[/]" if s.get("done") else "[green]ok[/]"
    if s.get("reachability") == "relayed":
        state += f", {escape(str(_reach(s)))}"
    elif s.get("reachability") == "unreachable":
        state += ", [red]unreachable[/]"
    return f"{state}, [yellow]{len(refused)} refused[/]" if refused else state


def _reach(s: dict[str, Any]) -> str | None:
    """How peers reach the node: ``direct``, ``relayed by node-2``, ``unreachable`` (None: a node too old to say)."""
    state = s.get("reachability")
    if state == "relayed":
        return f"relayed by {s.get('relay')}"
    return None if state is None else str(state)


def _relaying(s: dict[str, Any]) -> str | None:
    """What the node carries as a relay (None: it relays nobody, and never did)."""
    r = s.get("relaying")
    if not isinstance(r, dict) or not (r.get("slots") or r.get("connections")):
        return None
    return (f"{r.get('slots')}/{r.get('max_slots')} members, {r.get('connections')} connections, "
            f"{format_bytes(r.get('bytes'))}" + (f", {r.get('refused')} refused" if r.get("refused") else ""))


def _figure_of(s: dict[str, Any]) -> Figure:
    """The figure a node's local_accuracy and global_accuracy hold: its task's metric (accuracy: a node that
    predates tasks). The name is the node's word: escaped where it is shown."""
    metric = s.get("metric")
    return figure(metric if isinstance(metric, str) else None)


def _node_table(s: dict[str, Any], url: str) -> Table:
    table = Table(title=f"dfl-node {_dash(s.get('id'))} @ {escape(url)}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    headline = _figure_of(s)
    task = s.get("task")
    rows = [
        ("id", s.get("id")),
        ("swarm", s.get("swarm")),
        ("algorithm", s.get("algorithm")),
        # what the node learns: said where it is not the classes every node learned before tasks
        *([("task", task)] if task not in (None, "classification") else []),
        ("mode", s.get("mode")),
        ("round", s.get("round")),
        ("role", f"{s['role']}{' (fusing)' if s.get('fusing') else ''}" if s.get("role") else None),
        ("done", s.get("done")),
        (f"local {headline.metric}", headline.format(s.get("local_accuracy"))),
        (f"global {headline.metric}", headline.format(s.get("global_accuracy"))),
        # differential privacy: shown only where it is on
        *([("privacy", _privacy(s["privacy"], long=True))] if isinstance(s.get("privacy"), dict) else []),
        ("models sent/received", f"{_dash(s.get('models_sent'))} / {_dash(s.get('models_received'))}"),
        ("bytes sent/received", f"{format_bytes(s.get('bytes_sent'))} / {format_bytes(s.get('bytes_received'))}"),
        ("fusions", s.get("fusions")),
        ("rejected", _rejected(s.get("rejected"))),
        ("refused at hello", _refusals(s)),
        ("peers", _peers_summary(s.get("peers"))),
        ("data", format_data(s.get("data"))),
        # static peers (--peer) that do not answer: shown only then (a typo, or an outage; the log says why)
        *([("static peers not answering", ", ".join(map(str, s["unreachable_peers"])))]
          if s.get("unreachable_peers") else []),
        ("gRPC address", s.get("grpc_address")),
        ("reachability", _reach(s)),
        *([("relaying", _relaying(s))] if _relaying(s) else []),
        ("version", s.get("version")),
        ("uptime", None if s.get("uptime_s") is None else f"{float(s['uptime_s']):.0f} s"),
    ]
    for key, value in rows:
        table.add_row(escape(key), _dash(value))
    return table


def _refused_table(statuses: list[dict[str, Any]]) -> Table | None:
    """Every peer refused at Hello that the nodes shown report, with why (None: none): what keeps a device
    with other data, another model or a plugin missing out of the fleet. A refusal both ways is one row."""
    table = Table(title="refused at hello (they never join the fleet until this changes)", title_justify="left")
    for col in ("node", "peer", "reason", "refused by", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    rows: dict[tuple[str, str, str], tuple[set[str], str]] = {}
    for s in statuses:
        for r in (r for r in s.get("refused_peers") or [] if isinstance(r, dict)):
            key = (str(s.get("id")), str(r.get("id")), str(r.get("reason")))
            sides, detail = rows.setdefault(key, (set(), str(r.get("detail") or "")))
            sides.add("this node" if r.get("by") == "us" else "the peer")
    for (node, peer, reason), (sides, detail) in sorted(rows.items()):
        table.add_row(escape(node), escape(peer), f"[red]{escape(reason)}[/]",
                      "both" if len(sides) > 1 else sides.pop(), escape(detail))
    return table if rows else None


def _peer_table(s: dict[str, Any]) -> Table:
    now = time.time()
    table = Table(title="peers", title_justify="left")
    for col in ("id", "address", "http", "algorithm", "alive", "last seen"):
        table.add_column(col)
    for p in sorted(s.get("peers") or [], key=lambda p: str(p.get("id"))):
        last_seen = p.get("last_seen")
        ago = None if last_seen is None else max(0.0, now - float(last_seen))
        table.add_row(
            _dash(p.get("id")),
            _dash(p.get("address")),
            _dash(p.get("http_port")),
            _dash(p.get("algorithm")),
            "[green]alive[/]" if p.get("alive") else "[red]down[/]",
            "–" if ago is None else f"{ago:.1f} s ago",
        )
    return table


# The fleet table's columns, (header, cell): the narrow set fits 80 columns (a terminal's default, and a
# pipe's); --wide adds the rest. "local"/"global": the figures, named by the queried node's metric (_fleet_table).
NARROW = (("id", "id"), ("round", "round"), ("role", "role"), ("local", "local"), ("global", "global"),
          ("fusions", "fusions"), ("alive", "peers alive"), ("state", "state"))
WIDE = tuple((c, c) for c in ("id", "url", "algorithm", "mode", "round", "role", "local", "global", "sent/recv",
                              "fusions", "rejected", "peers", "state"))


def _privacy(p: dict[str, Any], long: bool = False) -> str:
    """A node's differential privacy as spent: ``ε 1.2 of 3`` (``ε 1.2`` without a budget), ``stopped`` once the
    budget stopped its training; ``long`` adds δ and σ."""
    def number(key: str) -> str:
        value = p.get(key)
        return f"{value:.3g}" if isinstance(value, int | float) else "–"

    text = f"ε {number('epsilon')}" + (f" of {number('budget')}" if p.get("budget") is not None else "")
    if long:
        text += f" at δ {number('delta')}, σ {number('noise_multiplier')}, clip {number('clip')}"
    return text + (" stopped" if p.get("exhausted") else "")


def _figure_cell(s: dict[str, Any], key: str, headline: Figure) -> str:
    """A node's figure in a column of ``headline``'s: named as well where the node's metric is another."""
    own = _figure_of(s)
    value = own.format(s.get(key))
    return value if own == headline or value == "–" else f"{value} {escape(own.metric)}"


def _fleet_row(r: dict[str, Any], headline: Figure) -> dict[str, str]:
    s = r.get("status")
    if s is None:
        label = "not queried" if r.get("url") is None else "unreachable"
        return {"id": _dash(r.get("id")), "url": _dash(r.get("url")), "state": f"[red]{label}: {_dash(r['error'])}[/]"}
    return {
        "id": _dash(s.get("id")), "url": _dash(r.get("url")), "algorithm": _dash(s.get("algorithm")),
        "mode": _dash(s.get("mode")), "round": _dash(s.get("round")), "role": _dash(s.get("role")),
        "local": _figure_cell(s, "local_accuracy", headline), "global": _figure_cell(s, "global_accuracy", headline),
        "sent/recv": f"{_dash(s.get('models_sent'))}/{_dash(s.get('models_received'))}",
        "fusions": _dash(s.get("fusions")), "rejected": _rejected(s.get("rejected")),
        "peers": _peers_summary(s.get("peers")), "peers alive": _alive(s.get("peers")), "state": _state(s),
        "ε": _privacy(s["privacy"]) if isinstance(s.get("privacy"), dict) else "–",
    }


def _fleet_table(rows: list[dict[str, Any]], wide: bool = False) -> Table:
    """The fleet's rows, the queried node's first: its metric names the figures' columns (``global acc``,
    ``global rmse``); the narrow table's ``local`` and ``global`` only where they hold percentages, which read as
    accuracies by themselves."""
    columns = WIDE if wide else NARROW
    if any(isinstance((r.get("status") or {}).get("privacy"), dict) for r in rows):  # ε beside the figures
        at = [header for header, _ in columns].index("global") + 1
        columns = (*columns[:at], ("ε", "ε"), *columns[at:])
    root = rows[0].get("status") if rows else None
    headline = _figure_of(root if isinstance(root, dict) else {})
    named = {scope: f"{scope} {headline.short}" for scope in ("local", "global") if wide or not headline.percent}
    table = Table(title="dfl-node fleet" + ("" if wide else " (--wide: every column)"), title_justify="left")
    for header, _ in columns:
        table.add_column(escape(named.get(header, header)), no_wrap=header != "state")
    for r in rows:
        cells = _fleet_row(r, headline)
        table.add_row(*(cells.get(cell, "–") for _, cell in columns))
    return table


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
                    out.print(_node_table(root, base_url))
                    if root.get("peers"):
                        out.print(_peer_table(root))
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
        out.print(_fleet_table(rows, wide))
        _print_refused(out, [r["status"] for r in rows if r["status"] is not None])
    return 1 if any(r["status"] is None for r in rows) else 0


def _print_refused(out: Console, statuses: list[dict[str, Any]]) -> None:
    table = _refused_table(statuses)
    if table is not None:
        out.print(table)
