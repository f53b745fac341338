"""What the membership cost and how well it knew the fleet, in a simulated run: the results' ``membership`` block.

A :class:`MembershipRecord` is told when each node starts and is killed (by the fleet), and every change of a
member's state at every node (a listener on each node's :class:`~dfl_node.node.membership.swim.Swim`); each node's side
of the fabric counts the membership messages of the calls it made and their estimated bytes
(:class:`~dfl_node.sim.traffic.Traffic`). From these, :meth:`MembershipRecord.figures`:

* ``messages_per_node_s`` and ``bytes_per_node_s``: Hellos, pings and their answers, per node and virtual second;
* ``suspicions``: suspicions a node raised itself (a failed probe), ``false_suspicions``: those of a member that
  was up then, and ``false_deaths``: members declared dead by somebody while they were up;
* ``detections``: for each kill, how long until the first and until the last node up declared it dead (None: some
  did not before it came back or the run ended), beside the stated bound
  (:func:`~dfl_node.node.membership.swim_bounds.detection_bound`);
* ``joins``: for each start, how long until every other node up knew the node alive (``join_s``: the longest; the
  start of the fleet, where all join at once, included).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from dfl_node.node.membership.swim_bounds import detection_bound
from dfl_node.node.membership.swim_member import ALIVE, DEAD, SUSPECT
from dfl_node.settings.node import MembershipSettings
from dfl_node.sim.endpoints import MemoryNetwork


@dataclass
class MembershipRecord:
    settings: MembershipSettings
    networks: list[MemoryNetwork] = field(default_factory=list)  # every node's, every life's
    up: dict[str, list[list[float]]] = field(default_factory=lambda: defaultdict(list))  # node -> [[start, end]...]
    # member -> [(time, observer, state, origin)]: origin is who said so (the observer itself: a first-hand verdict)
    events: dict[str, list[tuple[float, str, str, str]]] = field(default_factory=lambda: defaultdict(list))
    _up_at_cache: dict[float, list[str]] = field(default_factory=dict, init=False, repr=False)

    def started(self, node_id: str, at: float, network: MemoryNetwork) -> None:
        self.up[node_id].append([at, float("inf")])
        self._up_at_cache.clear()
        self.networks.append(network)

    def killed(self, node_id: str, at: float) -> None:
        self.up[node_id][-1][1] = at
        self._up_at_cache.clear()

    def observer(self, node_id: str) -> Any:
        """The listener for ``node_id``'s membership."""
        def changed(member: str, state: str, at: float, origin: str) -> None:
            self.events[member].append((at, node_id, state, origin))
        return changed

    def _is_up(self, node_id: str, at: float) -> bool:
        return any(start <= at < end for start, end in self.up[node_id])

    def _up_at(self, at: float) -> list[str]:
        """The nodes up at ``at``: kept until a node starts or is killed (a fleet's thousand starts at 0 ask the
        same)."""
        if (up := self._up_at_cache.get(at)) is None:
            up = self._up_at_cache[at] = [node_id for node_id in self.up if self._is_up(node_id, at)]
        return up

    def _up_during(self, node_id: str, start: float, end: float) -> bool:
        """Up from ``start`` to ``end`` in one life."""
        return any(s <= start and end <= e for s, e in self.up[node_id])

    def figures(self, duration: float) -> dict[str, Any]:
        nodes = len(self.up)
        messages = sum(n.membership.messages for n in self.networks)
        nbytes = sum(n.membership.bytes for n in self.networks)
        suspicions = [(m, at) for m, evs in self.events.items() for at, obs, state, origin in evs
                      if state == SUSPECT and origin == obs]
        false_deaths = {m for m, evs in self.events.items() for at, _, state, _ in evs
                        if state == DEAD and self._is_up(m, at)}
        detections = [self._detection(node_id, end, duration) for node_id, lives in sorted(self.up.items())
                      for _, end in lives if end != float("inf")]
        joins = [self.join_time(node_id, start) for node_id, lives in sorted(self.up.items()) for start, _ in lives]
        known = [j for j in joins if j is not None]
        return {
            "nodes": nodes, "duration_s": round(duration, 3),
            "messages_per_node_s": round(messages / nodes / duration, 3) if duration else None,
            "bytes_per_node_s": round(nbytes / nodes / duration, 1) if duration else None,
            "suspicions": len(suspicions),
            "false_suspicions": sum(self._is_up(m, at) for m, at in suspicions),
            "false_deaths": len(false_deaths),
            "detection_bound_s": round(detection_bound(self.settings, nodes), 3),
            "detections": detections,
            "join_s": round(max(known), 3) if known else None,
            "join_mean_s": round(fmean(known), 3) if known else None,
            "joins_unfinished": len(joins) - len(known),
        }

    def _detection(self, node_id: str, killed: float, ended: float) -> dict[str, Any]:
        """How long after ``killed`` the nodes up all along until it was back (or the run ``ended``) declared
        ``node_id`` dead (first, last: None if one never did)."""
        back = min((s for s, _ in self.up[node_id] if s > killed), default=ended)
        first: dict[str, float] = {}
        for at, observer, state, _ in self.events[node_id]:
            if state == DEAD and killed <= at < back and observer != node_id:
                first.setdefault(observer, at - killed)
        observers = [o for o in self.up if o != node_id and self._up_during(o, killed, back)]
        missing = [o for o in observers if o not in first]
        return {"node": node_id, "first_s": round(min(first.values()), 3) if first else None,
                "all_s": None if missing or not first else round(max(first[o] for o in observers), 3)}

    def join_time(self, node_id: str, start: float) -> float | None:
        """How long after ``start`` every other node up then (and since) knew ``node_id`` alive (None: not all)."""
        seen: dict[str, float] = {}
        for at, observer, state, _ in self.events[node_id]:
            if state == ALIVE and at >= start:
                seen.setdefault(observer, at - start)
        others = [o for o in self._up_at(start) if o != node_id]
        if any(o not in seen for o in others):
            return None
        return max((seen[o] for o in others), default=0.0)
