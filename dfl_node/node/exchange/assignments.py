"""A role for a node to play (:class:`Assignment`), in the node's own terms: the role, the step of the round plan it
plays it in, and what the holder that planned it says besides (its epoch, where the members serve, how long an
aggregator waits).

A holder's plan stays a :class:`~dfl_node.algorithms.plan.Step` all the way to the node that plays it: a role for
this node itself is played as it is, and only a role for a peer becomes the wire's
:class:`~dfl_node.peering.messages.Assignment` (:meth:`Assignment.wire`), turned back into an assignment where it
arrives (:meth:`Assignment.of`), which is also where one naming no role a node can play is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dfl_node.algorithms.plan import Group, Role, Step
from dfl_node.peering.messages import Assignment as WireAssignment

PLAYABLE = (Role.SENDER, Role.AGGREGATOR)  # the roles an assignment gives (a source and a candidate are asked for)


@dataclass(frozen=True)
class Assignment:
    role: Role
    step: Step
    epoch: int = 0  # the token's (fencing); 0 in async mode
    holder: str = ""  # who planned it: the token holder (async mode: the inviting volunteer, or "" for our own)
    aggregator_address: str = ""  # where a sender pushes
    deadline_s: float = 0.0  # an aggregator's longest wait for its senders (0: its own round_timeout)
    addresses: Mapping[str, str] = field(default_factory=dict)  # where the members serve, as the holder knew it

    @classmethod
    def of(cls, assignment: WireAssignment) -> Assignment | None:
        """The order an Assign carries; None where it names no role a node can be given (a sender, or an
        aggregator of a group that is not open)."""
        try:
            role = Role(assignment.role)
        except ValueError:
            return None
        if role not in PLAYABLE or (assignment.candidates and role is not Role.SENDER):
            return None
        group = Group(assignment.aggregator, tuple(assignment.senders), assignment.pull, tuple(assignment.candidates))
        return cls(role, Step(assignment.round, group, dict(assignment.state)), assignment.epoch, assignment.holder,
                   assignment.aggregator_address, assignment.deadline_s, dict(assignment.addresses))

    def wire(self) -> WireAssignment:
        """This order as an Assign to the node that plays it."""
        group = self.step.group
        return WireAssignment(round=self.step.round, epoch=self.epoch, holder=self.holder, role=self.role.value,
                          aggregator=group.aggregator, aggregator_address=self.aggregator_address,
                          state=dict(self.step.state), senders=group.senders, pull=group.pull,
                          deadline_s=self.deadline_s, candidates=group.candidates, addresses=dict(self.addresses))
