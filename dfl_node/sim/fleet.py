"""K real nodes in one process: the daemon's own :class:`~dfl_node.node.node.Node` — its round or async
scheduler, roles, collector, gate and checkpoints — each over the in-memory network
(:class:`~dfl_node.sim.network.MemoryFabric`) instead of gRPC, on the virtual clock of a
:class:`~dfl_node.sim.clock.VirtualTimeLoop`; a compromised one with its attack (:mod:`dfl_node.sim.adversaries`).

A node here is started, killed and restarted as a daemon is: :meth:`VirtualFleet.kill` is kill -9 (every task
of the node cancelled, whatever it had not made durable lost, its state dir unlocked as the kernel would),
:meth:`VirtualFleet.start` builds a new ``Node`` on the same config, which restores its checkpoint. This module is
the simulator's composition root, as :mod:`dfl_node.service` is the daemon's: it hands each node its network (an
endpoint of the fabric) and its clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dfl_node.learning.provision import TEST_FILE, architectures, fleet_ids
from dfl_node.node.core.identity import ModelIdentity
from dfl_node.node.node import Node
from dfl_node.peering.messages import Hello
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.settings.simulation import Adversaries
from dfl_node.sim.adversaries import compromised_algorithm
from dfl_node.sim.clock import VirtualClock
from dfl_node.sim.costs import classes_of
from dfl_node.sim.endpoints import MemoryNetwork
from dfl_node.sim.ledger import durable_states
from dfl_node.sim.link_profiles import LinkProfile
from dfl_node.sim.membership import MembershipRecord
from dfl_node.sim.network import MemoryFabric

BASE_PORT = 50_000  # the fleet's addresses are 127.0.0.1:50000+i: names on the fabric, never bound
# A node behind NAT serves at a private address (the same host, its own port): not loopback, so it asks whether peers
# can dial it (:mod:`dfl_node.node.membership.reach`), and the fabric says they cannot; its node relays nobody.
NAT_HOST = "192.168.0.1"


def plan_nodes(config: ExperimentConfig, algorithm: str, shards: Path, state: Path, *, mode: str = "round",
               **settings: Any) -> list[NodeConfig]:
    """Each node's config, as a testbed would start it (the experiment's learning settings, static peers, no
    mDNS, no REST), but checkpoints not fsynced (a kill here is in-process: the kernel keeps what was written);
    ``settings`` override any of them for every node."""
    ids = fleet_ids(config.nodes)
    classes = classes_of(ids, config.simulation.devices)
    nat = {n for n in ids if classes[n] in config.simulation.devices and config.simulation.devices[classes[n]].nat}
    hosts = {node_id: NAT_HOST if node_id in nat else "127.0.0.1" for node_id in ids}
    addresses = {node_id: f"{hosts[node_id]}:{BASE_PORT + i}" for i, node_id in enumerate(ids)}
    specs = architectures(config.architectures, config.learning, config.nodes)
    test = shards / TEST_FILE
    return [NodeConfig.for_experiment(config, **{
        "id": node_id, "model": specs[node_id].name, "hidden": list(specs[node_id].widths or ()),
        "data": shards / node_id, "test_data": test if test.exists() else None, "algorithm": algorithm, "mode": mode,
        "host": hosts[node_id], "insecure": node_id in nat, "relay_slots": 0 if node_id in nat else 16,
        "grpc_port": BASE_PORT + i, "http_port": 0, "mdns": False, "state_dir": state / node_id,
        # round mode starts once every node sees the whole fleet (its plans need it); an async node volunteers
        # once it sees one peer, as a deployment's does (a thousand nodes would otherwise wait for every one)
        "rounds": config.rounds, "min_peers": len(ids) - 1 if mode == "round" else 1, "fsync": False, "data_poll": 0,
        "max_pending_peers": max(32, len(ids)),  # every peer says Hello at once at the start
        # the addresses it can dial: a node behind NAT is known by the slot its relay gives it, through gossip
        "peers": [a for other, a in addresses.items() if other != node_id and other not in nat], **settings})
        for i, node_id in enumerate(ids)]


class VirtualFleet:
    """The nodes of ``configs`` on one fabric (each link costs what ``links`` says); build it, and use it, on
    a running :class:`~dfl_node.sim.clock.VirtualTimeLoop`."""

    def __init__(self, configs: list[NodeConfig], links: Callable[[str, str], LinkProfile] | None = None,
                 adversaries: Mapping[str, Adversaries] | None = None) -> None:
        self.configs = {c.id: c for c in configs}
        self.adversaries = dict(adversaries or {})  # compromised nodes: the attack each plays (sim.adversaries)
        self.fabric = MemoryFabric(links, seed=configs[0].learning.seed if configs else 0)
        self.fabric.install(asyncio.get_running_loop())
        self.nodes: dict[str, Node] = {}  # the nodes up now
        self.addresses = {c.id: c.network.address for c in configs}
        self.clock = VirtualClock()  # every node's: the loop's virtual time
        self.fingerprints: dict[str, str] = {}  # each node's model, once started
        self._ending: set[asyncio.Task[Any]] = set()  # tasks of killed nodes, cancelled: awaited by close()
        self.membership = MembershipRecord(configs[0].membership)  # what the membership cost and knew

    def start(self, node_id: str) -> Node:
        """Start (or restart, from its checkpoint) ``node_id``: it serves on the fabric and runs as
        :func:`~dfl_node.service.run.run_node` runs it (its first evaluation, its heartbeats, its scheduler)."""
        config = self.configs[node_id]
        address = self.addresses[node_id]

        def endpoint(identity: ModelIdentity, hello: Callable[[], Hello]) -> MemoryNetwork:
            network = self.fabric.endpoint(address, connect_timeout=config.network.connect_timeout,
                                           wire_dtype=identity.wire_dtype, max_upload=config.network.max_upload,
                                           max_download=config.network.max_download,
                                           relay_slots=config.network.relay_slots,
                                           behind_nat=config.network.host == NAT_HOST)
            self.membership.started(node_id, asyncio.get_running_loop().time(), network)
            return network

        adversary = self.adversaries.get(node_id)
        algorithm = compromised_algorithm(config.algorithm, config.learning, config.per_algorithm,
                                          adversary) if adversary else None
        node = Node(config, endpoint, self.clock, algorithm=algorithm)
        node.membership.swim.listeners.append(self.membership.observer(node_id))
        self.fabric.serve(address, node.requests, node.node_id)
        self.nodes[node_id] = node
        self.fingerprints[node_id] = node.identity.fingerprint
        self.fabric.spawn(address, _serve(node))
        return node

    def start_all(self) -> None:
        for node_id in self.configs:
            self.start(node_id)

    def kill(self, node_id: str) -> None:
        """kill -9: the node's tasks are cancelled, the calls it serves drop, its state dir is unlocked."""
        node = self.nodes.pop(node_id)
        self.membership.killed(node_id, asyncio.get_running_loop().time())
        for task in self.fabric.kill(self.addresses[node_id]):
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
        node.learner.checkpoint.lock.release()

    async def stop(self, node_id: str) -> None:
        """Stop as a daemon stops on SIGTERM once its work is done: its last state saved, then it goes."""
        await self.nodes[node_id].save(copy=True)
        self.kill(node_id)

    async def stop_all(self) -> None:
        """Stop every node as daemons stop once a run is done: each saves its last state, then all go at once. One
        by one, each node still up would see the others go — its members suspected, its relay lost and another
        found — and work on it for nothing: a thousand nodes, a million reactions."""
        for node_id in sorted(self.nodes):
            await self.nodes[node_id].save(copy=True)
        for node_id in sorted(self.nodes):
            self.kill(node_id)

    def partition(self, *sides: list[str]) -> None:
        self.fabric.partition(*({self.addresses[n] for n in side} for side in sides))

    def heal(self) -> None:
        self.fabric.heal()

    async def close(self) -> None:
        """Kill whatever still runs and wait until every task of every node has ended."""
        for node_id in list(self.nodes):
            self.kill(node_id)
        await asyncio.gather(*self._ending, return_exceptions=True)
        self._ending.clear()

    def durable_states(self) -> dict[str, dict[str, Any]]:
        """What each node made durable (:func:`~dfl_node.sim.ledger.durable_states`); call it once all stopped."""
        return durable_states(((n, c.state_path, self.fingerprints[n]) for n, c in self.configs.items()),
                              min(c.storage.history_limit for c in self.configs.values()))

    def round_reached(self) -> int:
        """The newest round a node now up has reached (round mode; async mode: 0)."""
        return max((node.progress.round for node in list(self.nodes.values())), default=0)

    async def finished(self) -> None:
        """Until every node now up has finished its run (its rounds, or its async duration)."""
        await asyncio.gather(*(n.scheduler.finished.wait() for n in self.nodes.values()))


async def _serve(node: Node) -> None:
    """A node's work once it serves, as :func:`~dfl_node.service.run.run_node` does it."""
    await node.start()
    await node.run()
