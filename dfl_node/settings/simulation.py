"""What an experiment config adds for a simulated fleet of real nodes (``dfl-node simulate``): what
computation costs on each class of devices (``devices:``), what a transfer costs on each class of links
(``links:``), what goes wrong when (``faults:``), which members are compromised (``adversaries:``), and whether
the leak of its models is measured (``privacy_audit:``). All times are virtual seconds (:mod:`dfl_node.sim.clock`).

:class:`SimulationSettings` is the ``simulation`` part of :class:`~dfl_node.settings.experiment.ExperimentConfig`;
it lives apart from :mod:`dfl_node.sim` so that reading settings does not import the simulator.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KILL_ROLES = ("holder", "aggregator", "sender", "any")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceClass(_Strict):
    """A class of devices: what its computation costs, and the link class it is attached by."""

    nodes: int = Field(..., ge=0, description="how many nodes are of this class (classes take nodes in order: "
                                              "node-0… to the first class, and so on; nodes left over: default)")
    step_s: float = Field(0.002, ge=0, description="seconds per training step (a batch through each model it trains)")
    eval_sample_s: float = Field(2e-6, ge=0, description="seconds per evaluated sample")
    link: str = Field("default", description="its link class (links:)")
    nat: bool = Field(False, description="behind NAT: nobody can dial it; it finds that out, and is reached through "
                      "a relay (a member that can be dialed), as a daemon is")


class LinkClass(_Strict):
    """A class of links: a transfer between two nodes costs the slower of their two classes."""

    latency_s: float = Field(0.005, ge=0, description="one-way latency of every message")
    bandwidth_mbps: float = Field(100.0, gt=0, description="megabits per second a model travels at")
    mtbf_s: float = Field(0.0, ge=0, description="mean seconds a connection over it lasts before the link drops it "
                          "(a modem that re-attaches, Wi-Fi at its range's edge; exponential, drawn from the run's "
                          "seed); 0: never. A cut model transfer resumes, as over gRPC")


class KillFault(_Strict):
    at: float = Field(..., ge=0, description="seconds from the start")
    node: str = Field("any", description="a node id, or the role its victim plays then: holder (of the round "
                                         "token), aggregator (mid-fusion), sender, or any")
    down_for: float = Field(1.0, ge=0, description="seconds until it restarts from its checkpoint")


class PartitionFault(_Strict):
    at: float = Field(..., ge=0, description="seconds from the start")
    sides: list[list[str]] | None = Field(None, description="node ids on each side; left out: two halves")
    heal_after: float = Field(..., gt=0, description="seconds until every link is back")


class LinkFault(_Strict):
    """A slow or lossy link for a while: each message to or from ``nodes`` costs at least ``latency_s`` and
    travels at most at ``bandwidth_mbps``, and is lost with probability ``loss`` — TCP then sends it again after
    its retransmission timeout, so a lost message costs ``retransmit_s`` more each time, as on a real lossy link."""

    at: float = Field(..., ge=0, description="seconds from the start")
    for_s: float = Field(..., gt=0, description="seconds until the link is as its class says again")
    nodes: list[str] | None = Field(None, description="the node ids whose links degrade; left out: every link")
    latency_s: float = Field(0.1, ge=0, description="one-way latency of every message meanwhile")
    bandwidth_mbps: float = Field(1.0, gt=0, description="megabits per second meanwhile")
    loss: float = Field(0.0, ge=0, lt=1, description="probability that a message is lost (and sent again)")
    retransmit_s: float = Field(0.2, gt=0, description="what each loss adds: TCP's retransmission timeout")
    mtbf_s: float = Field(0.0, ge=0, description="mean seconds a connection lasts meanwhile before the link drops "
                          "it (0: as its class says)")


class SlowNodeFault(_Strict):
    """A node whose computation slows down for a while (thermal throttling, a competing process)."""

    at: float = Field(..., ge=0, description="seconds from the start")
    for_s: float = Field(..., gt=0, description="seconds until it runs at its device's speed again")
    node: str = Field(..., description="the node id")
    factor: float = Field(10.0, ge=1, description="how many times its device's time each step and sample take")


class FaultSchedule(_Strict):
    """What goes wrong, and when."""

    kills: list[KillFault] = []
    partitions: list[PartitionFault] = []
    links: list[LinkFault] = []
    slow_nodes: list[SlowNodeFault] = []

    @classmethod
    def random(cls, seed: int, kills: int, *, peer_timeout: float, recovery: float, slow_recovery: float,
               partitions: int = 1, heal_within: float = 30.0, start: float = 10.0, slowdowns: int = 0,
               nodes: list[str] | None = None) -> FaultSchedule:
        """``kills`` kill -9s and ``partitions`` partitions at seeded random moments, one at a time: each comes
        once the fleet had time to recover from the one before (``recovery`` after a victim back within
        ``peer_timeout``, ``slow_recovery`` after one back later, or after a heal). Victims' roles cycle holder,
        aggregator, sender, any; every other one is back before ``peer_timeout`` (nobody saw it leave).

        Then ``slowdowns`` (drawn apart, so a seed's kills stay the same), one at a time as well: a slow, lossy
        link to one of ``nodes``, then one of them slowed down, and so on, each for up to ``heal_within``."""
        rng = random.Random(seed)
        schedule = cls()
        partition_slots = set(rng.sample(range(kills + partitions), partitions))
        t = start
        for i in range(kills + partitions):
            t += rng.uniform(0.0, 10.0)
            if i in partition_slots:
                heal_after = rng.uniform(0.5, 1.0) * heal_within
                schedule.partitions.append(PartitionFault(at=t, heal_after=heal_after))
                t += heal_after + slow_recovery
                continue
            n = len(schedule.kills)
            quick = n % 2 == 0
            down = peer_timeout * (rng.uniform(0.1, 0.8) if quick else rng.uniform(1.2, 2.0))
            schedule.kills.append(KillFault(at=t, node=KILL_ROLES[n % len(KILL_ROLES)], down_for=down))
            t += down + (recovery if quick else slow_recovery)
        if slowdowns and not nodes:
            raise ValueError("random slowdowns need the fleet's node ids")
        slow = random.Random(f"{seed}-slowdowns")
        for i in range(slowdowns):
            t += slow.uniform(0.0, 10.0)
            for_s, node = slow.uniform(0.2, 1.0) * heal_within, slow.choice(nodes or [])
            if i % 2 == 0:
                schedule.links.append(LinkFault(at=t, for_s=for_s, nodes=[node], loss=slow.uniform(0.05, 0.3)))
            else:
                # slower, but within what the timeouts allow (a node 10× slower would have its groups abandoned)
                schedule.slow_nodes.append(SlowNodeFault(at=t, for_s=for_s, node=node, factor=slow.uniform(1.5, 2.0)))
            t += for_s + slow_recovery
        return schedule


AttackKind = Literal["sign-flip", "scale", "noise", "label-flip", "false-count", "free-rider"]
# Each attack's strength where none is given; label-flip and free-rider take none.
STRENGTHS: dict[str, float] = {"sign-flip": 1.0, "scale": 10.0, "noise": 0.1, "false-count": 1e9}


class Adversaries(_Strict):
    """A share of a simulated fleet's members compromised, all playing one attack (docs/robustness.md): written
    ``KIND:FRACTION[:STRENGTH]`` on the command line (``--adversaries sign-flip:0.2``), or as a mapping."""

    kind: AttackKind = Field(..., description="sign-flip: sends −strength·w; scale: boosts its change since its "
                             "last model strength times (model replacement); noise: adds N(0, strength²); "
                             "label-flip: trains on labels y → C−1−y; false-count: claims strength samples; "
                             "free-rider: never sends what it trained, only what it last received")
    fraction: float = Field(..., gt=0, lt=1, description="share of the nodes (rounded to whole nodes, at least one)")
    strength: float | None = Field(None, description="the attack's size (default per kind: sign-flip 1, scale 10, "
                                   "noise 0.1, false-count 1e9)")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        """``KIND:FRACTION[:STRENGTH]``, as a flag or a ``DFL_ADVERSARIES`` item gives it."""
        if not isinstance(value, str):
            return value
        kind, _, rest = value.partition(":")
        fraction, _, strength = rest.partition(":")
        if not fraction:
            raise ValueError(f"{value!r} is not KIND:FRACTION[:STRENGTH] (e.g. sign-flip:0.2)")
        return {"kind": kind, "fraction": fraction, **({"strength": strength} if strength else {})}

    @model_validator(mode="after")
    def _strength_fits_the_kind(self) -> Adversaries:
        if self.strength is not None and self.kind not in STRENGTHS:
            raise ValueError(f"{self.kind} takes no strength (got {self.strength:g})")
        if self.strength is not None and self.strength < 0:
            raise ValueError(f"{self.kind}: strength must be ≥ 0 (got {self.strength:g})")
        return self

    @property
    def size(self) -> float:
        """The attack's strength: the one given, else its kind's default (none: 0)."""
        return self.strength if self.strength is not None else STRENGTHS.get(self.kind, 0.0)

    def count(self, nodes: int) -> int:
        """How many of ``nodes`` play it: ``fraction`` of them, rounded, at least one."""
        return max(1, round(self.fraction * nodes))

    def __str__(self) -> str:
        return f"{self.kind}:{self.fraction:g}" + (f":{self.strength:g}" if self.strength is not None else "")


def adversary_counts(adversaries: list[Adversaries], nodes: int) -> list[int]:
    """How many nodes each entry of ``adversaries`` compromises; a ValueError where no honest node would be left."""
    counts = [a.count(nodes) for a in adversaries]
    if sum(counts) >= nodes:
        raise ValueError(f"adversaries {', '.join(map(str, adversaries))} compromise {sum(counts)} of {nodes} nodes: "
                         "no honest node would be left")
    return counts


class SimulationSettings(_Strict):
    """``dfl-node simulate``'s own: the fleet's devices, links and faults (set in a config file only), its
    compromised members (``--adversaries`` too), and whether it measures what its models leak
    (``--privacy-audit``)."""

    devices: dict[str, DeviceClass] = Field(default_factory=dict, description="simulate: device classes by "
                                            "name, what computation costs on each")
    links: dict[str, LinkClass] = Field(default_factory=dict, description="simulate: link classes by name, "
                                        "what a transfer costs on each (\"default\": nodes of no class)")
    faults: FaultSchedule = Field(default_factory=FaultSchedule, description="simulate: kills and "
                                  "partitions, in virtual seconds")
    adversaries: list[Adversaries] = Field(default_factory=list, description="simulate: compromised members, "
                                           "KIND:FRACTION[:STRENGTH] each (sign-flip, scale, noise, label-flip, "
                                           "false-count, free-rider; docs/robustness.md); results report the honest "
                                           "nodes apart")
    privacy_audit: bool = Field(False, description="simulate: once the run is over, each node's final model is "
                                "attacked by a curious member (the next node) by membership inference: AUC, TPR at 1 "
                                "% FPR and advantage per node and for the fleet in the results (docs/privacy.md)")
