"""What computation and transfers cost in virtual time: the ``devices:`` and ``links:`` of an experiment config
(:mod:`dfl_node.sim_config`) as the two functions the simulated fleet needs — the loop's charge for each call run
off it (:class:`~dfl_node.sim.clock.InlineExecutor`), and the fabric's link profile between two nodes."""

from __future__ import annotations

from dfl_node.learning.work import Work
from dfl_node.sim.clock import CostFn
from dfl_node.sim.network import LinkProfile, ProfileFn, current_node
from dfl_node.sim_config import DeviceClass, LinkClass

DEFAULT = "default"


def classes_of(node_ids: list[str], devices: dict[str, DeviceClass]) -> dict[str, str]:
    """Each node's device class: the classes take the nodes in order (``DEFAULT`` for those left over)."""
    if sum(c.nodes for c in devices.values()) > len(node_ids):
        raise ValueError(f"devices: {sum(c.nodes for c in devices.values())} nodes in classes, "
                         f"the fleet has {len(node_ids)}")
    names = [name for name, c in devices.items() for _ in range(c.nodes)]
    return {node_id: names[i] if i < len(names) else DEFAULT for i, node_id in enumerate(node_ids)}


class CostModel:
    """Device and link classes of a fleet whose nodes serve at ``addresses`` (by node id)."""

    def __init__(self, addresses: dict[str, str], devices: dict[str, DeviceClass], links: dict[str, LinkClass]
                 ) -> None:
        self.devices = {DEFAULT: DeviceClass(nodes=0), **devices}
        self.links = {DEFAULT: LinkClass(), **links}
        unknown = sorted({c.link for c in self.devices.values()} - set(self.links))
        if unknown:
            raise ValueError(f"devices: link class(es) {', '.join(unknown)} not in links:")
        classes = classes_of(list(addresses), devices)
        self.device_of = {address: self.devices[classes[node_id]] for node_id, address in addresses.items()}
        self.class_of = {node_id: classes[node_id] for node_id in addresses}

    def compute(self) -> CostFn:
        """Virtual seconds a call took on the calling node's device: its steps and evaluated samples."""
        def cost(work: Work) -> float:
            device = self.device_of.get(current_node() or "", self.devices[DEFAULT])
            return work.steps * device.step_s + work.samples_evaluated * device.eval_sample_s
        return cost

    def transfer(self) -> ProfileFn:
        """The link between two nodes: the slower of their link classes (more latency, less bandwidth)."""
        def profile(src: str, dst: str) -> LinkProfile:
            a, b = (self.links[self.device_of.get(x, self.devices[DEFAULT]).link] for x in (src, dst))
            return LinkProfile(max(a.latency_s, b.latency_s), min(a.bandwidth_mbps, b.bandwidth_mbps) * 1e6 / 8)
        return profile
