"""Prometheus text exposition (format 0.0.4) of a :class:`NodeStatus`, written by hand.

Every metric family carries ``# HELP`` and ``# TYPE`` lines and a ``node`` label (the node id).
Accuracy gauges are left out entirely while the node has no accuracy to report; a family with no
samples (``dfl_rejected_total`` before any rejection) keeps its HELP/TYPE lines, which the format
allows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from dfl_node.api.schemas import NodeStatus

__all__ = ["CONTENT_TYPE", "escape_help", "escape_label_value", "format_value", "render_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    """Escape a label value: backslash, double quote and line feed (format 0.0.4)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Escape HELP text: backslash and line feed only."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float | int | bool) -> str:
    """A sample value as Prometheus writes it (integers without a decimal point, NaN, ±Inf)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in labels.items()) + "}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[Mapping[str, str], float | int | bool]],
    ) -> None:
        self.lines.append(f"# HELP {name} {escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {format_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"



# One counter family per Counters field, named dfl_<field>_total.
COUNTER_HELP = {
    "models_sent": "Models (or model segments) sent to peers.",
    "models_received": "Models (or model segments) received from peers.",
    "bytes_sent": "Model payload bytes sent to peers.",
    "bytes_received": "Model payload bytes received from peers.",
    "fusions": "Fusions performed by this node.",
    "rounds_completed": "Rounds this node completed.",
    "busy_refusals": "Transfers refused because a node was busy.",
    "senders_abandoned": "Senders an aggregator left out: their transfer never came in time.",
    "groups_abandoned": "Round mode: groups skipped because their live members refused their roles for a "
                        "round_timeout.",
    "probes_sent": "Client-selection probes sent to candidate receivers.",
    "probes_unanswered": "Client-selection probes that got no valid answer in time (the candidate was skipped).",
    "probes_answered": "Client-selection probes answered as a candidate.",
}

def render_metrics(status: NodeStatus) -> str:
    """The node's metrics in Prometheus text format 0.0.4 (ends with a newline)."""
    node = {"node": status.id}
    w = _Writer()
    w.family(
        "dfl_info",
        "gauge",
        "Static information about the node (value is always 1).",
        [
            (
                {
                    **node,
                    "swarm": status.swarm,
                    "algorithm": status.algorithm,
                    "mode": status.mode,
                    "version": status.version,
                    "boot_id": status.boot_id,
                },
                1,
            )
        ],
    )
    w.family("dfl_round", "gauge", "Current round of the node.", [(node, status.round)])
    for field, help_text in COUNTER_HELP.items():
        w.family(f"dfl_{field}_total", "counter", help_text, [(node, getattr(status, field))])
    w.family(
        "dfl_rejected_total",
        "counter",
        "Rejected transfers or handshakes, by reason.",
        [({**node, "reason": reason}, count) for reason, count in sorted(status.rejected.items())],
    )
    alive = sum(p.alive for p in status.peers)
    w.family("dfl_peers", "gauge", "Peers in the peer table that are alive.", [(node, alive)])
    w.family("dfl_peers_known", "gauge", "Peers in the peer table, alive or not.", [(node, len(status.peers))])
    if status.local_accuracy is not None:
        w.family(
            "dfl_local_accuracy",
            "gauge",
            "Accuracy of the node's model on its local validation split.",
            [(node, status.local_accuracy)],
        )
    if status.global_accuracy is not None:
        w.family(
            "dfl_global_accuracy",
            "gauge",
            "Accuracy of the node's model on the global test set.",
            [(node, status.global_accuracy)],
        )
    w.family("dfl_fusing", "gauge", "1 while the node is fusing a model.", [(node, status.fusing)])
    w.family("dfl_done", "gauge", "1 once the node reached its round/time budget.", [(node, status.done)])
    w.family("dfl_uptime_seconds", "gauge", "Seconds since this process started.", [(node, status.uptime_s)])
    return w.text()
