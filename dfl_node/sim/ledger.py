"""The fleet's durable record: what every node made durable (its final checkpoint and the history stored
with it), read back after a run with faults — never what a node said before it died.

* every final checkpoint loads, holds the fleet's model (its fingerprint) and only finite weights;
* round mode: every round up to the fleet's last completed one was fused exactly once (one group a round,
  Q = 1), and no node sent twice for a round;
* no accepted model is lost: each transfer a sender counts as done ("send" in its history) was fused by its
  aggregator, durably ("fusion" there, naming the sender);
* the stall after a fault: from the fault to the next fusion anywhere in the fleet.

Shared by the simulator's fault schedules (:mod:`dfl_node.sim.faults`) and the real-daemon storms of the tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dfl_node.node.model.persistence import Checkpoint


def durable_states(nodes: Iterable[tuple[str, Path, str]], history_limit: int) -> dict[str, dict[str, Any]]:
    """Each stopped node's checkpoint, by node id, from (id, state dir, fingerprint of its model): it must
    load (:meth:`Checkpoint.load` checks the fingerprint), hold finite weights, and its whole history (shorter
    than ``history_limit``); else ``AssertionError`` naming the node."""
    states = {}
    for node_id, state_dir, fingerprint in nodes:
        saved = Checkpoint(state_dir).load(fingerprint)
        assert saved is not None, f"{node_id}: no checkpoint"
        model, state = saved
        bad = [k for k, v in model.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        assert not bad, f"{node_id}: non-finite {bad}"
        assert len(state["history"]) < history_limit, f"{node_id}: history truncated"
        states[node_id] = state
    return states


@dataclass
class Ledger:
    """The fleet's durable record of exchanges, from every node's history."""

    fusions: list[tuple[str, int, set[str], float]]  # (aggregator, round fused, its senders, wall time)
    sends: list[tuple[str, int, str]]  # (sender, round, aggregator): transfers their senders count as done
    rejected: dict[str, dict[str, int]]  # node id -> its refusals by reason (what /status shows as "rejected")

    @classmethod
    def of(cls, states: dict[str, dict[str, Any]]) -> Ledger:
        fusions, sends = [], []
        rejected = {node_id: {k: v for k, v in state["rejected"].items() if v} for node_id, state in states.items()}
        for node_id, state in states.items():
            for h in state["history"]:  # an entry's round is the round after the exchange
                if h["event"] == "fusion":
                    fusions.append((node_id, h["round"] - 1, set(h["peer"].split(",")), h["time"]))
                elif h["event"] == "send":
                    sends.append((node_id, h["round"] - 1, h["peer"]))
        return cls(fusions, sends, rejected)

    def lost_models(self) -> list[tuple[str, int, str]]:
        """Sends whose aggregator holds no durable fusion of them: accepted, counted, and gone."""
        fused = {(a, r, s) for a, r, senders, _ in self.fusions for s in senders}
        return [(s, r, a) for s, r, a in self.sends if (a, r, s) not in fused]

    def per_round(self) -> Counter[int]:
        return Counter(r for _, r, _, _ in self.fusions)

    def lost_rounds(self, completed: int) -> list[int]:
        """Round mode: rounds before ``completed`` that nobody fused."""
        fused = self.per_round()
        return [r for r in range(completed) if fused[r] == 0]

    def repeated_rounds(self) -> list[int]:
        """Round mode: rounds fused more than once (Q = 1), or in which a node sent twice."""
        twice = {r for r, n in self.per_round().items() if n > 1}
        return sorted(twice | {r for (_, r, _), n in Counter(self.sends).items() if n > 1})

    def repeated_fusions(self) -> list[tuple[str, int]]:
        """Async mode: an aggregator that recorded two fusions for one of its exchange counts."""
        return [k for k, n in Counter((a, r) for a, r, _, _ in self.fusions).items() if n > 1]

    def stall_after(self, at: float) -> float:
        """Seconds from ``at`` (a fault, on the nodes' wall clock) to the next fusion anywhere (inf: none)."""
        return min((t for _, _, _, t in self.fusions if t > at), default=float("inf")) - at


def completed_rounds(states: dict[str, dict[str, Any]]) -> int:
    """Rounds the fleet completed: a node's round passes t only once round t fused, or was announced after."""
    return max(state["round"] for state in states.values())
