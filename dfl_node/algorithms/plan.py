"""The shape of a round (protocol v2): groups of senders around one aggregator.

Every round of every algorithm here is a set of disjoint **groups**. In a group, the senders each
transmit one message to the aggregator, which fuses *all* of them at once and may answer each
sender. A pair (000's Def-KT, FullAvg, Combo) is a group with one sender; DFML (003) and its
baselines have many senders; a **pull** (002) is a group whose aggregator fetches the messages
itself, so its sources need not be told about the round. An **open** group (001's client selection)
names its sender and the *candidates* its aggregator is to be chosen from: the sender picks one
when it plays its role (:func:`dfl_node.algorithms.runner.play_sender`). Plans read **profiles**: the
small facts a node advertises about itself. Everything here is plain data: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum


class Role(str, Enum):
    """What a node is doing for a round; a node plays at most one at a time."""

    IDLE = "idle"
    SENDER = "sender"  # trains (as its algorithm says) and transmits to the group's aggregator
    AGGREGATOR = "aggregator"  # fuses the group's messages and answers the senders
    SOURCE = "source"  # serves its model to a pulling aggregator
    CANDIDATE = "candidate"  # answers a selecting sender's probe (001), for a moment


@dataclass(frozen=True)
class NodeProfile:
    """What a node advertises (Hello in the daemon, the node context in the simulator).

    ``model`` is the node's architecture as a registry spec (``mlp:32,32``, ``cnn-ln:32,64``), so a
    plan can group nodes by architecture without seeing a model.
    """

    node_id: str
    model: str
    num_samples: int


@dataclass(frozen=True)
class Group:
    aggregator: str  # "" in an open group, until its sender has chosen one of the candidates
    senders: tuple[str, ...]
    pull: bool = False  # the aggregator fetches the senders' messages (they are sources, not told in advance)
    candidates: tuple[str, ...] = ()  # an open group: whom its sender may choose as the aggregator

    @property
    def open(self) -> bool:
        return bool(self.candidates)

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(m for m in (self.aggregator, *self.senders, *self.candidates) if m)

    def bound(self, aggregator: str) -> Group:
        """This open group once its sender chose ``aggregator`` among the candidates: a plain group."""
        if aggregator not in self.candidates:
            raise ValueError(f"{aggregator!r} is not a candidate of this group ({', '.join(self.candidates)})")
        return Group(aggregator, self.senders, self.pull)


@dataclass(frozen=True)
class RoundPlan:
    """Round t's groups, and the algorithm state handed on to round t + 1 (with the round token)."""

    round: int
    groups: tuple[Group, ...]
    state: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        members = [m for g in self.groups for m in g.members]
        if len(members) != len(set(members)):
            raise ValueError(f"round {self.round}: a node is in two groups ({members})")

    def __iter__(self) -> Iterator[Group]:
        return iter(self.groups)


@dataclass(frozen=True)
class Step:
    """What a member needs to play its part in one group of one round."""

    round: int
    group: Group
    state: Mapping[str, str] = field(default_factory=dict)  # the plan's state (what round t needs, and hands on)
