"""Playing a fault schedule (:class:`~dfl_node.settings.simulation.FaultSchedule`) on a simulated fleet of real nodes
(:class:`~dfl_node.sim.fleet.VirtualFleet`): kill -9 with a restart from the checkpoint after a delay,
partitions that heal, slow or lossy links and slow nodes for a while (through the fleet's
:class:`~dfl_node.sim.costs.CostModel`). After the run, :func:`fault_figures` reads what the nodes made durable
(:mod:`dfl_node.sim.ledger`) into the results' ``faults`` block.

A kill names a node, or a role that the node must hold at that moment: ``holder`` (it holds the round token),
``aggregator`` (mid-fusion: it has fused a model whose result is not yet durable), ``sender`` (it sends, not
holding the token) or ``any``. The driver waits, in virtual time, until some node plays the role.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from dfl_node.algorithms.plan import Role
from dfl_node.node.membership.swim_bounds import detection_bound, notice_bound
from dfl_node.node.node import Node
from dfl_node.node.schedule.liveness import liveness_bound
from dfl_node.settings.node import NodeConfig
from dfl_node.settings.simulation import FaultSchedule, KillFault, LinkFault, PartitionFault, SlowNodeFault
from dfl_node.sim.costs import CostModel
from dfl_node.sim.fleet import VirtualFleet
from dfl_node.sim.ledger import Ledger, completed_rounds

log = logging.getLogger(__name__)

ROLE_WAIT_S = 120.0  # how long a kill waits for a node in its role before it takes any node


def stall_bound(config: NodeConfig, quick: bool, round_work: float) -> float:
    """:func:`~dfl_node.node.schedule.liveness.liveness_bound` for ``config``'s timeouts and fleet (a simulated node
    lists every other as a static peer), plus one round's own work."""
    membership, schedule = config.membership, config.schedule
    members = len(membership.peers) + 1
    detection = notice_bound(membership, members) if quick else detection_bound(membership, members)
    return liveness_bound(detection=detection, token_timeout=schedule.token_timeout,
                          heartbeat=membership.heartbeat, round_timeout=schedule.round_timeout,
                          quick=quick) + round_work


@dataclass
class Fault:
    """A fault as it happened: when, to whom, what the victim was doing."""

    kind: Literal["kill", "partition", "link", "slow"]
    at: float  # the nodes' wall clock (virtual)
    node: str
    role: str
    back_after: float  # seconds until it served again (otherwise: until the fault was over)


def _playing(node: Node, role: str) -> bool:
    if role == "holder":
        return node.progress.holding
    if role == "aggregator":
        return node.roles.fusing
    if role == "sender":
        return node.roles.role is Role.SENDER and not node.progress.holding
    return True


async def _victim(fleet: VirtualFleet, wanted: str, rng: random.Random) -> Node | None:
    """A node up now in the role ``wanted`` (or the node of that id); waits for one in virtual time, then any."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ROLE_WAIT_S
    while True:
        up = sorted(fleet.nodes)
        if wanted in fleet.configs:
            return fleet.nodes.get(wanted)
        playing = [fleet.nodes[n] for n in up if _playing(fleet.nodes[n], wanted)]
        if playing:
            return rng.choice(playing)
        if loop.time() >= deadline:
            return fleet.nodes[rng.choice(up)] if up else None
        await asyncio.sleep(0.05)


async def play_faults(fleet: VirtualFleet, costs: CostModel, schedule: FaultSchedule, seed: int) -> list[Fault]:
    """Play ``schedule`` on ``fleet`` (started; its links and devices costed by ``costs``), in order, from now;
    returns the faults as they happened. A victim restarts ``down_for`` after its kill, from its checkpoint;
    a slow link or node is itself again after ``for_s``."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    start = loop.time()
    events: list[Any] = sorted([*schedule.kills, *schedule.partitions, *schedule.links, *schedule.slow_nodes],
                               key=lambda f: f.at)
    happened: list[Fault] = []
    later: list[asyncio.Task[None]] = []  # restarts, and the ends of slowdowns
    for event in events:
        await asyncio.sleep(max(0.0, start + event.at - loop.time()))
        if isinstance(event, LinkFault):
            costs.degrade(event)
            happened.append(Fault("link", fleet.clock.wall(), ",".join(event.nodes or ["all"]), "-", event.for_s))
            later.append(loop.create_task(_after(event.for_s, costs.restore, event)))
            continue
        if isinstance(event, SlowNodeFault):
            costs.slow_down(event.node, event.factor)
            happened.append(Fault("slow", fleet.clock.wall(), event.node, "-", event.for_s))
            later.append(loop.create_task(_after(event.for_s, costs.slow_down, event.node, 1.0)))
            continue
        if isinstance(event, PartitionFault):
            ids = sorted(fleet.configs)
            sides = event.sides or [ids[: len(ids) // 2], ids[len(ids) // 2:]]
            fleet.partition(*sides)
            happened.append(Fault("partition", fleet.clock.wall(), "|".join(",".join(s) for s in sides), "-",
                                  event.heal_after))
            await asyncio.sleep(event.heal_after)
            fleet.heal()
            continue
        assert isinstance(event, KillFault)
        node = await _victim(fleet, event.node, rng)
        if node is None:
            continue
        role = "holder" if node.progress.holding else "aggregator" if node.roles.fusing else node.roles.role.value
        fleet.kill(node.node_id)
        log.info("fault: kill -9 %s (%s), back in %.1f s", node.node_id, role, event.down_for)
        happened.append(Fault("kill", fleet.clock.wall(), node.node_id, role, event.down_for))
        later.append(loop.create_task(_after(event.down_for, fleet.start, node.node_id)))
    await asyncio.gather(*later)
    return happened


async def _after(seconds: float, then: Callable[..., object], *args: Any) -> None:
    await asyncio.sleep(seconds)
    then(*args)


def fault_figures(faults: list[Fault], states: dict[str, dict[str, Any]], config: NodeConfig, round_work: float
                  ) -> dict[str, Any]:
    """The results' ``faults`` block, from what the nodes made durable; each fault's stall (from the fault, or
    from a partition's heal, to the next fusion anywhere) beside its :func:`stall_bound`."""
    ledger = Ledger.of(states)
    completed = completed_rounds(states)
    round_mode = config.schedule.mode == "round"
    stalls, rows = [], []
    for fault in faults:
        quick = fault.kind == "kill" and fault.back_after < config.membership.peer_timeout
        since = fault.at + (0.0 if fault.kind == "kill" else fault.back_after)  # others: from the fault's end
        stalls.append(ledger.stall_after(since))
        bound = stall_bound(config, quick, round_work) if round_mode else None  # async: no round to wait for
        rows.append({"kind": fault.kind, "node": fault.node, "role": fault.role,
                     "back_after_s": round(fault.back_after, 3), "stall_s": round(stalls[-1], 3),
                     "bound_s": None if bound is None else round(bound, 3)})
    return {
        "kills": sum(f.kind == "kill" for f in faults),
        "partitions": sum(f.kind == "partition" for f in faults),
        "links_degraded": sum(f.kind == "link" for f in faults),
        "nodes_slowed": sum(f.kind == "slow" for f in faults),
        "rounds_completed": completed if round_mode else None,
        "rounds_lost": len(ledger.lost_rounds(completed)) if round_mode else None,
        "rounds_run_twice": len(ledger.repeated_rounds()) if round_mode else None,
        # rounds given up on purpose: a group whose members stayed alive but could not play it (rounds.py)
        "groups_abandoned": sum(s.get("counters", {}).get("groups_abandoned", 0) for s in states.values()),
        "fusions_recorded_twice": len(ledger.repeated_fusions()),
        "accepted_models_lost": len(ledger.lost_models()),
        "longest_stall_s": round(max(stalls, default=0.0), 3),
        "faults": rows,
    }
