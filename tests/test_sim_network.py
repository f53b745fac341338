"""Real :class:`Node` objects on the in-memory peer network and a virtual clock, in one process.

The nodes are the daemon's own (round scheduler, roles, collector, checkpoints), with static peers and no mDNS;
only their two ports differ: :class:`~dfl_node.sim.network.MemoryFabric` instead of gRPC, and a
:class:`~dfl_node.sim.clock.VirtualTimeLoop` under a :class:`~dfl_node.sim.clock.VirtualClock`. So a token
timeout of virtual seconds costs next to no wall time, and the result is the simulator's, bit for bit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import torch

from dfl_node.node.membership.swim_bounds import detection_bound
from dfl_node.node.node import Node
from dfl_node.settings.node import MembershipSettings
from dfl_node.sim.clock import run_virtual
from dfl_node.sim.experiment import run_fleet
from dfl_node.sim.fleet import VirtualFleet
from dfl_node.sim.link_profiles import LinkProfile
from tests.helpers.fleet import FLEET, simulated, virtual_fleet
from tests.helpers.waiting import until

ROUNDS = 3


def sim_fleet(shards: Path, state: Path, rounds: int, algorithm: str = "defkt", *,
              profile: LinkProfile | None = None, **settings: object) -> AbstractAsyncContextManager[VirtualFleet]:
    """The test fleet of ``rounds`` rounds as K real nodes on one fabric (every link costs ``profile``), without
    their first evaluation; ``settings`` override the nodes' config."""
    return virtual_fleet(FLEET.model_copy(update={"rounds": rounds}), algorithm, shards, state, links=profile,
                         evaluate=False, **settings)


# Each compute call (training, a fusion, a check, a checkpoint) costs this much virtual time, and each message
# this much latency: the fleet's timeline moves, and its schedule must still not change what it computes.
COMPUTE_S, LATENCY_S = 0.5, 0.01
ROUND_WORK_S = 10 * COMPUTE_S  # one round's own work on that clock, with room (a pair: a few compute calls)


@pytest.mark.parametrize("algorithm", ["defkt", "fairavg", "fedavg"])  # a pair, a pull, a group algorithm
def test_what_compute_and_links_cost_changes_no_bit(algorithm: str, fleet_shards: Path, tmp_path: Path) -> None:
    """The timeline moves with the costs (each compute call 0.5 virtual s, each message 10 ms): the nodes'
    models end as ``dfl-node simulate``'s, whose default costs are others, bit for bit."""
    async def main() -> tuple[dict[str, dict[str, torch.Tensor]], float]:
        async with sim_fleet(fleet_shards, tmp_path / "costed", ROUNDS, algorithm,
                             profile=LinkProfile(LATENCY_S)) as fleet:
            await asyncio.wait_for(fleet.finished(), 600)
            return ({n: node.learner.ctx.snapshot() for n, node in fleet.nodes.items()},
                    asyncio.get_running_loop().time())

    states, virtual = run_virtual(main(), lambda work: COMPUTE_S, FLEET.learning.threads)
    result, models = simulated(FLEET.model_copy(update={"rounds": ROUNDS}), algorithm, tmp_path / "simulate")
    assert states.keys() == models.keys()
    for node_id, expected in models.items():
        got = states[node_id]
        assert got.keys() == expected.keys(), node_id
        differ = [name for name, tensor in expected.items() if not torch.equal(got[name], tensor)]
        assert not differ, f"{node_id}: {differ} differ from the simulator's"
    assert virtual >= ROUNDS * COMPUTE_S  # the clock moved: at least one compute call per round
    assert virtual != result.wall_time_s  # … and differently from the default costs'


def test_a_killed_holder_s_token_is_regenerated_within_the_liveness_bound_of_virtual_time(
        fleet_shards: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kill -9 of the token holder mid-run (never restarted): the others regenerate the token and finish every
    round. A member down for good is waited for, so the stall is bounded by liveness.py's bound
    with ``round_timeout`` added; every wait is a virtual-time ``wait_for``, so a hang fails in seconds."""
    caplog.set_level(logging.INFO, logger="dfl_node")  # shown if it fails: what the scheduler waited for
    rounds, token_timeout, round_timeout, peer_timeout, heartbeat = 6, 30.0, 60.0, 4.0, 1.0
    detection = detection_bound(MembershipSettings(peer_timeout=peer_timeout, heartbeat=heartbeat), FLEET.nodes)
    bound = (detection + token_timeout + round_timeout + 2 * heartbeat + min(1.0, token_timeout / 4)
             + ROUND_WORK_S)

    async def main() -> tuple[int, float, float, list[Node]]:
        loop = asyncio.get_running_loop()
        running = sim_fleet(fleet_shards, tmp_path, rounds, token_timeout=token_timeout, round_timeout=round_timeout,
                            peer_timeout=peer_timeout, heartbeat=heartbeat)
        async with running as fleet:
            nodes = list(fleet.nodes.values())
            await until(lambda: any(n.progress.holding and n.progress.round >= 1 for n in nodes), 60)
            holder = next(n for n in nodes if n.progress.holding)
            round_at_kill, epoch_at_kill = holder.progress.round, holder.progress.epoch
            fleet.kill(holder.node_id)
            killed_at = loop.time()
            others = [n for n in nodes if n is not holder]
            await until(lambda: any(n.progress.epoch > epoch_at_kill for n in others), 2 * bound)
            regenerated_after = loop.time() - killed_at
            await asyncio.wait_for(fleet.finished(), 2 * bound + rounds * 60)
            return round_at_kill, regenerated_after, loop.time(), others

    wall = time.perf_counter()
    round_at_kill, regenerated_after, virtual, others = run_virtual(main(), lambda work: COMPUTE_S,
                                                                    FLEET.learning.threads)
    wall = time.perf_counter() - wall
    assert 1 <= round_at_kill < rounds
    assert token_timeout <= regenerated_after <= bound, caplog.text  # silence, then regenerated in time
    assert all(n.progress.done and n.progress.round == rounds for n in others)
    assert wall < 30, f"{wall:.1f} s of wall time for {virtual:.0f} virtual seconds"


def test_nodes_that_evaluate_on_the_schedule_draw_the_simulators_curve(fleet_shards: Path, tmp_path: Path) -> None:
    """A node once evaluated after every change, which cost more than a round where the test set is large.
    Now only the models that stand at the curve's points are evaluated — once each, a model off the schedule
    just before a later role replaces it — and the curve is still that of nodes evaluated every round, value
    for value."""
    config = FLEET.model_copy(update={"rounds": 12, "eval_every": 4})
    scheduled = run_fleet(config, "defkt", tmp_path)
    every_round = run_fleet(config.model_copy(update={"eval_every": 1}), "defkt", tmp_path / "every-round")
    expected = {h.round: (h.per_node_local, h.per_node_global, h.bytes_transmitted) for h in every_round.history
                if h.round % config.eval_every == 0}
    assert {h.round: (h.per_node_local, h.per_node_global, h.bytes_transmitted) for h in scheduled.history} == expected
    assert list(expected) == [0, 4, 8, 12] and expected[0][2] == 0 < expected[4][2] < expected[8][2]
    histories = [json.loads(path.read_text())["history"] for path in (tmp_path / "defkt").glob("*/state.json")]
    changes = sum(h["event"] in ("send", "fusion") for history in histories for h in history)
    evaluations = sum(h["local_accuracy"] is not None for history in histories for h in history)
    points = config.rounds // config.eval_every
    # each node: its w0, once per point at most, and its final model; before, w0 and after every change
    assert len(histories) == config.nodes and evaluations <= config.nodes * (points + 2) < changes + config.nodes, \
        (evaluations, changes)
