"""Round mode when the token holder disappears (real nodes, real gRPC on loopback, in one process):
the token dies with it, the lowest live id regenerates it at epoch + 1, and the fleet completes every
round exactly once."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from dfl_node.service.run import run_node
from dfl_node.testbed.launcher import free_port
from tests.helpers.fleet import daemon

ROUNDS = 8


async def test_holder_lost_with_the_token_is_replaced_by_a_new_epoch(fleet_shards: Path, tmp_path: Path) -> None:
    ports = [free_port() for _ in range(4)]
    swarm = f"loss-{uuid.uuid4().hex[:6]}"
    daemons = [
        daemon(
            id=f"node-{i}", data=fleet_shards / f"node-{i}",
            grpc_port=port, http_port=0, mdns=False, swarm=swarm, state_dir=tmp_path / f"node-{i}",
            peers=[f"127.0.0.1:{p}" for p in ports if p != port], min_peers=3, rounds=ROUNDS,
            heartbeat=0.2, peer_timeout=1.0, token_timeout=1.0, round_timeout=5.0, evaluate=False,
        )  # fmt: skip
        for i, port in enumerate(ports)
    ]
    nodes = [d.node for d in daemons]
    stops = [asyncio.Event() for _ in nodes]
    victim, survivors = nodes[2], [nodes[i] for i in (0, 1, 3)]
    took_token = asyncio.Event()

    def die_holding_the_token(round_: int, epoch: int, members: object = ()) -> None:
        took_token.set()  # node-2 acknowledged the token for round 2 (it rotates in id order)…
        stops[2].set()  # …and goes away before planning that round

    victim.scheduler._start_holding = die_holding_the_token
    tasks = [asyncio.create_task(run_node(d, stop)) for d, stop in zip(daemons, stops)]
    try:
        await asyncio.wait_for(asyncio.gather(*(n.scheduler.finished.wait() for n in survivors)), 120)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)
    assert took_token.is_set() and victim.progress.round == 2 and not victim.progress.done
    for node in survivors:
        assert node.progress.done and node.progress.round == ROUNDS, node.config.id
        assert node.progress.epoch == 2, node.config.id  # one regeneration, fenced by a new epoch
    assert sum(n.tally.counters["models_sent"] for n in nodes) == ROUNDS  # no round lost, none run twice
    assert sum(n.tally.counters["fusions"] for n in nodes) == ROUNDS
