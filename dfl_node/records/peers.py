"""A row of the node's peer table (``/status``' ``peers``), and what the node measured of its link to the peer.

The peer table (:mod:`dfl_node.node.membership.peers`) keeps its rows as these records; ``/status`` serves them as they
are.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LinkReport", "PeerInfo"]


class LinkReport(BaseModel):
    """What a node measured of its link to one peer, from the model transfers between them (docs/fleet.md)."""

    sent_bytes_per_s: float | None = Field(default=None, description="throughput of the newest models sent to the "
                                           "peer, bytes/s (smoothed; a cap, --max-upload, bounds it)")
    received_bytes_per_s: float | None = Field(default=None, description="throughput of the newest models received "
                                               "from it, bytes/s (smoothed; --max-download bounds it)")
    transfers: int = Field(0, description="model transfers with the peer that arrived whole")
    failed: int = Field(0, description="model transfers that did not, after their retries (refusals excluded)")
    cuts: int = Field(0, description="streams the link cut mid-way (each resumed where it could be)")
    resent_bytes: int = Field(0, description="bytes sent again because a stream was cut")
    weak: bool = Field(False, description="one of its 4 newest transfers was cut or failed: transfers over it stream "
                       "small chunks, and async mode invites the peer last")


class PeerInfo(BaseModel):
    """One row of the node's peer table."""

    model_config = ConfigDict(extra="ignore")

    id: str
    address: str = Field(description="gRPC address of the peer, host:port")
    http_port: int | None = Field(default=None, description="the peer's REST status port, if it announced one")
    status_url: str | None = Field(default=None, description="where the peer says operators reach its REST API")
    last_seen: float = Field(description="unix time the peer was last heard from")
    alive: bool
    algorithm: str | None = None
    model: str | None = Field(default=None, description="the peer's architecture, a registry spec")
    work_s: float | None = Field(default=None, description="seconds of computation the peer's last role took, as it "
                                 "says (its estimate before any role): a holder's deadlines for it follow this")
    link: LinkReport | None = Field(default=None, description="what this node measured of its link to the peer")
    relay: str | None = Field(default=None, description="the member the peer is reached through, as it says (it is "
                              "behind NAT or a firewall; its address is its slot on that relay); None: directly")
