"""A node's own progress, in one typed object with one owner (the :class:`~dfl_node.node.daemon.Node`).

Schedulers read it and change it only through the node's scheduler port
(:class:`~dfl_node.node.ports.SchedulerPort`); the REST status is a snapshot of it; the checkpoint
stores the durable part (:meth:`NodeState.durable`).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from dfl_node.algorithms.plan import Role
from dfl_node.api.schemas import FleetEvent, HistoryEntry

HISTORY_LIMIT = 2048  # default of --history-limit: /history and state.json keep this many newest entries
RECENT_LIMIT = 50  # /fleet's recent sends, fusions and refusals (this process only: not checkpointed)


@dataclass
class NodeState:
    round: int = 0  # rounds completed (round mode) or group exchanges taken part in (async mode)
    epoch: int = 0  # round mode: the newest token epoch seen (fencing)
    # round mode: the last round this node completed a role in (its fusion, or its transfer confirmed fused),
    # durable, so that a retried or regenerated round never makes it fuse or send for that round again
    played: int = -1
    done: bool = False
    role: Role = Role.IDLE
    holding: bool = False  # round mode: this node holds the round token
    holding_since: float | None = None  # wall clock: since when it holds it (for /fleet's token age)
    token_state: dict[str, str] = field(default_factory=dict)  # the algorithm state the round token carries
    fusing: int = 0
    max_fusing: int = 0
    accuracy: tuple[float | None, float | None] = (None, None)  # (local, global) of the current model
    digest: str = ""  # sha256 of the current parameters
    history: deque[HistoryEntry] = field(default_factory=lambda: deque(maxlen=HISTORY_LIMIT))  # the newest only
    counters: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    recent: deque[FleetEvent] = field(default_factory=lambda: deque(maxlen=RECENT_LIMIT))

    def durable(self) -> dict[str, Any]:
        """What a checkpoint keeps (role, fusing and recent events are about this process only)."""
        return {"round": self.round, "epoch": self.epoch, "played": self.played, "done": self.done,
                "token_state": self.token_state,
                "counters": dict(self.counters), "rejected": dict(self.rejected),
                "history": [h.model_dump(mode="json") for h in self.history]}

    def restore(self, saved: dict[str, Any]) -> None:
        self.round, self.epoch = saved.get("round", 0), saved.get("epoch", 0)
        self.played = saved.get("played", -1)
        self.token_state = dict(saved.get("token_state", {}))
        self.counters.update(saved.get("counters", {}))
        self.rejected.update(saved.get("rejected", {}))
        self.history = deque((HistoryEntry.model_validate(h) for h in saved.get("history", [])),
                             maxlen=self.history.maxlen)
        evaluated = [h for h in self.history if (h.local_accuracy, h.global_accuracy) != (None, None)]
        if evaluated:  # the newest accuracy known (a change off the evaluation schedule has none)
            self.accuracy = (evaluated[-1].local_accuracy, evaluated[-1].global_accuracy)
