"""The fleet as one node sees it (``GET /fleet``, the dashboard's table): its members, the round token, and the
node's recent sends, fusions and refusals (which its tally keeps as :class:`FleetEvent`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from dfl_node.records.peers import LinkReport

__all__ = ["FleetEvent", "FleetMember", "FleetView", "TokenView"]


class FleetMember(BaseModel):
    """One node of the fleet as this node knows it: itself, or a peer as of its last answer to our Hello
    (a heartbeat old at most), so a fleet page needs no request to any other node."""

    id: str
    is_self: bool = Field(default=False, description="this row is the node serving the page")
    status_url: str | None = Field(default=None, description="the member's REST API (its dashboard is at /), "
                                   "if it announced one")
    grpc_address: str
    alive: bool
    last_seen: float | None = Field(default=None, description="unix time it was last heard from (None: itself)")
    round: int | None = Field(default=None, description="its round, None until it answered a Hello")
    role: str | None = None
    local_accuracy: float | None = None
    global_accuracy: float | None = None
    holding: bool = False
    done: bool = False
    algorithm: str | None = None
    model: str | None = None
    work_s: float | None = Field(default=None, description="seconds of computation its last role took, as it says")
    link: LinkReport | None = Field(default=None, description="what the serving node measured of its link to it")
    relay: str | None = Field(default=None, description="the member it is reached through (it is behind NAT), as it "
                              "says; None: directly")


class TokenView(BaseModel):
    """Round mode: who holds the round token, as far as this node knows, and since when. A holder that keeps
    it far longer than a round takes is what a stalled fleet looks like."""

    holder: str | None = Field(description="node id of the holder (None: no node says it holds one)")
    epoch: int
    since: float = Field(description="unix time this node first saw this holder hold this epoch")
    age_s: float = Field(description="seconds since then")


class FleetEvent(BaseModel):
    """One of this node's recent sends, fusions or refusals (newest last)."""

    time: float = Field(description="unix time of the event")
    event: Literal["send", "fusion", "refusal", "replan"]
    round: int
    peer: str | None = None
    detail: str = Field(default="", description="bytes and seconds of an exchange; the reason of a refusal")


class FleetView(BaseModel):
    """The fleet as one node sees it, served by ``GET /fleet`` (the dashboard's fleet table)."""

    node: str
    mode: Literal["round", "async"]
    metric: str = Field(default="accuracy", description="the headline metric the members' local_accuracy and "
                        "global_accuracy hold (the serving node's task's: a fleet learns one task)")
    members: list[FleetMember] = Field(description="this node first, then its peers by id")
    token: TokenView | None = Field(default=None, description="round mode only")
    recent: list[FleetEvent] = Field(default_factory=list)
