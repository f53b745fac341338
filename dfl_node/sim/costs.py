"""What computation and transfers cost in virtual time: the ``devices:`` and ``links:`` of an experiment config
(:mod:`dfl_node.settings.simulation`) as the two functions the simulated fleet needs — the loop's charge for each call
run off it (:class:`~dfl_node.sim.clock.InlineExecutor`), and the fabric's link profile between two nodes — and the
faults that degrade them for a while (:class:`~dfl_node.settings.simulation.LinkFault`,
:class:`~dfl_node.settings.simulation.SlowNodeFault`, played by :mod:`dfl_node.sim.faults`)."""

from __future__ import annotations

import math
import random

from dfl_node.learning.work import Work
from dfl_node.settings.simulation import DeviceClass, LinkClass, LinkFault
from dfl_node.sim.clock import CostFn
from dfl_node.sim.link_profiles import LinkProfile, ProfileFn
from dfl_node.sim.owners import current_node

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

    def __init__(self, addresses: dict[str, str], devices: dict[str, DeviceClass], links: dict[str, LinkClass],
                 seed: int = 0) -> None:
        self.devices = {DEFAULT: DeviceClass(nodes=0), **devices}
        self.links = {DEFAULT: LinkClass(), **links}
        unknown = sorted({c.link for c in self.devices.values()} - set(self.links))
        if unknown:
            raise ValueError(f"devices: link class(es) {', '.join(unknown)} not in links:")
        classes = classes_of(list(addresses), devices)
        self.device_of = {address: self.devices[classes[node_id]] for node_id, address in addresses.items()}
        self.class_of = {node_id: classes[node_id] for node_id in addresses}
        self.addresses = addresses
        self.slowdown: dict[str, float] = {}  # address -> the factor its computation takes longer, while slowed
        self.degraded: dict[str, LinkFault] = {}  # address -> the fault its links suffer now
        self._losses = random.Random(f"{seed}-losses")  # which messages a lossy link loses: the run's seed decides

    # ----- faults ---------------------------------------------------------------------------
    def slow_down(self, node_id: str, factor: float) -> None:
        """From now on, ``node_id``'s computation takes ``factor`` times its device's (1: as its device says)."""
        self.slowdown[self.addresses[node_id]] = factor

    def degrade(self, fault: LinkFault) -> None:
        """From now on, the links of ``fault``'s nodes (all, if it names none) suffer it, until :meth:`restore`."""
        for node_id in fault.nodes or list(self.addresses):
            self.degraded[self.addresses[node_id]] = fault

    def restore(self, fault: LinkFault) -> None:
        for address in [a for a, f in self.degraded.items() if f is fault]:
            del self.degraded[address]

    # ----- the two cost functions -------------------------------------------------------------

    def compute(self) -> CostFn:
        """Virtual seconds a call took on the calling node's device: its steps and evaluated samples."""
        def cost(work: Work) -> float:
            node = current_node() or ""
            device = self.device_of.get(node, self.devices[DEFAULT])
            seconds = work.steps * device.step_s + work.samples_evaluated * device.eval_sample_s
            return seconds * self.slowdown.get(node, 1.0)
        return cost

    def transfer(self) -> ProfileFn:
        """The link between two nodes: the slower of their link classes (more latency, less bandwidth, shorter
        connections), or of a fault either end suffers now; a lossy one adds a retransmission timeout per loss, drawn
        message by message."""
        default = self.devices[DEFAULT].link
        plain: dict[tuple[str, str], LinkProfile] = {}  # by the ends' link classes: a link neither end's fault slows

        def profile(src: str, dst: str) -> LinkProfile:
            ends = (self.device_of[src].link if src in self.device_of else default,
                    self.device_of[dst].link if dst in self.device_of else default)
            faults = {id(f): f for f in (self.degraded.get(src), self.degraded.get(dst)) if f}
            if not faults and (known := plain.get(ends)) is not None:
                return known  # every membership message asks: a thousand nodes, thousands of times a virtual second
            a, b = self.links[ends[0]], self.links[ends[1]]
            latency, mbps = max(a.latency_s, b.latency_s), min(a.bandwidth_mbps, b.bandwidth_mbps)
            mtbf = [a.mtbf_s, b.mtbf_s]
            for fault in faults.values():
                latency, mbps = max(latency, fault.latency_s), min(mbps, fault.bandwidth_mbps)
                mtbf.append(fault.mtbf_s)
                while self._losses.random() < fault.loss:
                    latency += fault.retransmit_s
            link = LinkProfile(latency, mbps * 1e6 / 8, min((m for m in mtbf if m > 0), default=math.inf))
            if not faults:
                plain[ends] = link
            return link
        return profile
