"""What a node tells its operator as it works: the INFO line of each send or fusion (and /fleet's recent event),
and the summary a finished run ends with. Round numbers are ``/history``'s (a step's index + 1)."""

from __future__ import annotations

import logging
from typing import Literal

from dfl_node.node.core.clock import Clock
from dfl_node.node.core.tally import Tally
from dfl_node.records.formatting import Figure, format_bytes
from dfl_node.settings.node import ScheduleSettings

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits
Accuracy = tuple[float | None, float | None]  # (local, global), of the node's task's metric


class Reporter:
    """The lines of node ``node_id``, which runs on ``schedule`` since ``started`` (its clock's wall time); what
    it did is ``tally``'s; ``headline`` names its figures (``accuracy local 91.23%``, ``rmse local 0.4123``)."""

    def __init__(self, node_id: str, schedule: ScheduleSettings, clock: Clock, started: float, tally: Tally,
                 headline: Figure) -> None:
        self.node_id, self.schedule, self.clock, self.started, self.tally = node_id, schedule, clock, started, tally
        self.headline = headline

    def _figures(self, local: float | None, global_: float | None) -> str:
        shown = self.headline
        return f"{shown.metric} local {shown.format(local)}, global {shown.format(global_)}"

    def progress_text(self, round_: int) -> str:
        """``round 5/20`` (round mode, toward --rounds), ``exchange 12, 34 s of 60 s`` (async, toward --duration)."""
        schedule = self.schedule
        if schedule.mode == "round":
            return f"round {round_}/{schedule.rounds}" if schedule.rounds else f"round {round_}"
        elapsed = self.clock.wall() - self.started
        return f"exchange {round_}, {elapsed:.0f} s" + (f" of {schedule.duration:.0f} s" if schedule.duration else "")

    def exchange(self, event: Literal["send", "fusion"], role: str, round_: int, peer: str, seconds: float, moved: int,
                 accuracy: Accuracy | None) -> None:
        """The INFO line of a send or a fusion (with ``accuracy`` where the model was evaluated), and /fleet's
        recent event."""
        what = f"sent to {peer}" if event == "send" else f"fused {peer}"
        traffic = f"{format_bytes(moved)} in {seconds:.2f} s" if moved else f"{seconds:.2f} s"
        self.tally.event(event, peer, traffic, round_)
        shown = f"; {self._figures(*accuracy)}" if accuracy is not None and accuracy != (None, None) else ""
        log.info("%s: %s: %s as %s, %s%s", self.node_id, self.progress_text(round_), what, role, traffic, shown)

    def summary(self, what: str, accuracy: Accuracy) -> None:
        """The run's last INFO line: what ended it, the node's exchanges and its final figures."""
        counters = self.tally.counters
        log.info("%s: %s: %d sends, %d fusions, %s sent, %s received; %s", self.node_id, what,
                 counters["models_sent"], counters["fusions"], format_bytes(counters["bytes_sent"]),
                 format_bytes(counters["bytes_received"]), self._figures(*accuracy))
