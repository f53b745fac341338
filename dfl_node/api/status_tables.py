"""How ``dfl-node status`` draws what nodes report: one node's table, its peers', the fleet's (``--all``) and the
refusals seen across it. Statuses are plain dicts (see :mod:`dfl_node.api.status_cli`): a field a node of another
version lacks prints as "–".
"""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from rich.table import Table

from dfl_node.records.formatting import Figure, figure, format_bytes, format_data


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


def node_table(s: dict[str, Any], url: str) -> Table:
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


def refused_table(statuses: list[dict[str, Any]]) -> Table | None:
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


def peer_table(s: dict[str, Any]) -> Table:
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
# pipe's); --wide adds the rest. "local"/"global": the figures, named by the queried node's metric (fleet_table).
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


def fleet_table(rows: list[dict[str, Any]], wide: bool = False) -> Table:
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
