"""A peer refused at Hello (``/status``' ``refused_peers``), as the node's refusal table keeps it
(:mod:`dfl_node.node.membership.refusals`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RefusedPeer"]


class RefusedPeer(BaseModel):
    """A peer refused at Hello, by this node or by the peer itself: it never joins the fleet until it changes."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(description="the peer's node id, as its Hello said")
    address: str = Field(description="gRPC address of the peer, host:port")
    http_port: int | None = Field(default=None, description="the peer's REST status port, if it announced one")
    status_url: str | None = Field(default=None, description="where the peer says operators reach its REST API")
    reason: str = Field(description="stable code: unknown_model, unknown_algorithm, sample_shape_mismatch, "
                        "num_classes_mismatch, architecture_mismatch, fingerprint_mismatch, algorithm_mismatch, …")
    detail: str = Field(default="", description="what differs, theirs and ours")
    by: Literal["us", "peer"] = Field(description='"us": this node refused the peer; "peer": the peer refused us')
    since: float = Field(description="unix time of the first such refusal")
    last: float = Field(description="unix time of the newest")
