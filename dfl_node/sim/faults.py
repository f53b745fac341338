"""Playing a fault schedule (:class:`~dfl_node.sim_config.FaultSchedule`) on a simulated fleet of real nodes
(:class:`~dfl_node.sim.fleet.VirtualFleet`): kill -9 with a restart from the checkpoint after a delay, and
partitions that heal. After the run, :func:`fault_figures` reads what the nodes made durable
(:mod:`dfl_node.sim.ledger`) into the results' ``faults`` block.

A kill names a node, or a role that the node must hold at that moment: ``holder`` (it holds the round token),
``aggregator`` (mid-fusion: it has fused a model whose result is not yet durable), ``sender`` (it sends, not
holding the token) or ``any``. The driver waits, in virtual time, until some node plays the role.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Literal

from dfl_node.algorithms.plan import Role
from dfl_node.node.config import NodeConfig
from dfl_node.node.daemon import Node
from dfl_node.node.rounds import liveness_bound
from dfl_node.sim.fleet import VirtualFleet
from dfl_node.sim.ledger import Ledger, completed_rounds
from dfl_node.sim_config import FaultSchedule, PartitionFault

log = logging.getLogger(__name__)

ROLE_WAIT_S = 120.0  # how long a kill waits for a node in its role before it takes any node


def stall_bound(config: NodeConfig, quick: bool, round_work: float) -> float:
    """:func:`~dfl_node.node.rounds.liveness_bound` for ``config``'s timeouts, plus one round's own work."""
    return liveness_bound(peer_timeout=config.peer_timeout, token_timeout=config.token_timeout,
                          heartbeat=config.heartbeat, round_timeout=config.round_timeout, quick=quick) + round_work


@dataclass
class Fault:
    """A fault as it happened: when, to whom, what the victim was doing."""

    kind: Literal["kill", "partition"]
    at: float  # the nodes' wall clock (virtual)
    node: str
    role: str
    back_after: float  # seconds until it served again (a partition: until it healed)


def _playing(node: Node, role: str) -> bool:
    state = node.state
    if role == "holder":
        return state.holding
    if role == "aggregator":
        return state.fusing > 0
    if role == "sender":
        return state.role is Role.SENDER and not state.holding
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


async def play_faults(fleet: VirtualFleet, schedule: FaultSchedule, seed: int) -> list[Fault]:
    """Play ``schedule`` on ``fleet`` (started), in order, from now; returns the faults as they happened. A
    victim restarts ``down_for`` after its kill, from its checkpoint."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    start = loop.time()
    events: list[Any] = sorted([*schedule.kills, *schedule.partitions], key=lambda f: f.at)
    happened: list[Fault] = []
    restarts: list[asyncio.Task[None]] = []
    for event in events:
        await asyncio.sleep(max(0.0, start + event.at - loop.time()))
        if isinstance(event, PartitionFault):
            ids = sorted(fleet.configs)
            sides = event.sides or [ids[: len(ids) // 2], ids[len(ids) // 2:]]
            fleet.partition(*sides)
            happened.append(Fault("partition", fleet.clock.wall(), "|".join(",".join(s) for s in sides), "-",
                                  event.heal_after))
            await asyncio.sleep(event.heal_after)
            fleet.heal()
            continue
        node = await _victim(fleet, event.node, rng)
        if node is None:
            continue
        role = "holder" if node.state.holding else "aggregator" if node.state.fusing else node.state.role.value
        fleet.kill(node.node_id)
        log.info("fault: kill -9 %s (%s), back in %.1f s", node.node_id, role, event.down_for)
        happened.append(Fault("kill", fleet.clock.wall(), node.node_id, role, event.down_for))
        restarts.append(loop.create_task(_restart(fleet, node.node_id, event.down_for)))
    await asyncio.gather(*restarts)
    return happened


async def _restart(fleet: VirtualFleet, node_id: str, after: float) -> None:
    await asyncio.sleep(after)
    fleet.start(node_id)


def fault_figures(faults: list[Fault], states: dict[str, dict[str, Any]], config: NodeConfig, round_work: float
                  ) -> dict[str, Any]:
    """The results' ``faults`` block, from what the nodes made durable; each fault's stall (from the fault, or
    from a partition's heal, to the next fusion anywhere) beside its :func:`stall_bound`."""
    ledger = Ledger.of(states)
    completed = completed_rounds(states)
    round_mode = config.mode == "round"
    stalls, rows = [], []
    for fault in faults:
        quick = fault.kind == "kill" and fault.back_after < config.peer_timeout
        since = fault.at + (fault.back_after if fault.kind == "partition" else 0.0)  # a partition: from its heal
        stalls.append(ledger.stall_after(since))
        bound = stall_bound(config, quick, round_work) if round_mode else None  # async: no round to wait for
        rows.append({"kind": fault.kind, "node": fault.node, "role": fault.role,
                     "back_after_s": round(fault.back_after, 3), "stall_s": round(stalls[-1], 3),
                     "bound_s": None if bound is None else round(bound, 3)})
    return {
        "kills": sum(f.kind == "kill" for f in faults),
        "partitions": sum(f.kind == "partition" for f in faults),
        "rounds_completed": completed if round_mode else None,
        "rounds_lost": len(ledger.lost_rounds(completed)) if round_mode else None,
        "rounds_run_twice": len(ledger.repeated_rounds()) if round_mode else None,
        "fusions_recorded_twice": len(ledger.repeated_fusions()),
        "accepted_models_lost": len(ledger.lost_models()),
        "longest_stall_s": round(max(stalls, default=0.0), 3),
        "faults": rows,
    }
