"""What a node tells its operator as it works: the INFO line of each send or fusion (and /fleet's recent
event), and the summary a finished run ends with. Round numbers are ``/history``'s (a step's index + 1)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dfl_node.api.formatting import format_accuracy, format_bytes
from dfl_node.api.schemas import FleetEvent

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger("dfl_node.node.daemon")  # the node's own log lines, wherever the code sits


def _accuracy(local: float | None, global_: float | None) -> str:
    return f"accuracy local {format_accuracy(local)}, global {format_accuracy(global_)}"


def progress_text(node: Node, round_: int) -> str:
    """``round 5/20`` (round mode, toward --rounds), ``exchange 12, 34 s of 60 s`` (async, toward --duration)."""
    config = node.config
    if config.mode == "round":
        return f"round {round_}/{config.rounds}" if config.rounds else f"round {round_}"
    elapsed = node.clock.wall() - node.started
    return f"exchange {round_}, {elapsed:.0f} s" + (f" of {config.duration:.0f} s" if config.duration else "")


def report_exchange(node: Node, event: str, round_: int, peer: str, seconds: float, moved: int,
                    evaluated: bool) -> None:
    """The INFO line of a send or a fusion (its accuracy if it was evaluated), and /fleet's recent event."""
    state = node.state
    what = f"sent to {peer}" if event == "send" else f"fused {peer}"
    traffic = f"{format_bytes(moved)} in {seconds:.2f} s" if moved else f"{seconds:.2f} s"
    state.recent.append(FleetEvent(time=node.clock.wall(), event="send" if event == "send" else "fusion",
                                   round=round_, peer=peer, detail=traffic))
    accuracy = f"; {_accuracy(*state.accuracy)}" if evaluated and state.accuracy != (None, None) else ""
    log.info("%s: %s: %s as %s, %s%s", node.config.id, progress_text(node, round_), what, state.role.value,
             traffic, accuracy)


def log_summary(node: Node, what: str) -> None:
    """The run's last INFO line: what ended it, the node's exchanges and its final accuracy."""
    counters = node.state.counters
    log.info("%s: %s: %d sends, %d fusions, %s sent, %s received; %s", node.config.id, what,
             counters["models_sent"], counters["fusions"], format_bytes(counters["bytes_sent"]),
             format_bytes(counters["bytes_received"]), _accuracy(*node.state.accuracy))
