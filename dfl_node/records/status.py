"""A node's status snapshot, as ``GET /status`` serves it and ``/metrics`` reads it: built by the node on demand
(:mod:`dfl_node.node.views`) from the records its parts keep.

Counters are exposed **flattened at the top level** of :class:`NodeStatus` (``models_sent``,
``bytes_received``, …) because that is the shape clients ask for; the node keeps its counters apart and splats
them in (``NodeStatus(**counters, …)``), and :attr:`NodeStatus.counters` gives the grouped view back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dfl_node import __version__
from dfl_node.records.counters import COUNTER_FIELDS, Counters
from dfl_node.records.peers import PeerInfo
from dfl_node.records.refusals import RefusedPeer

__all__ = ["DataStatus", "NodeStatus", "PrivacyView", "RelayView"]


class RelayView(BaseModel):
    """What a node carries as a relay for members their peers cannot dial (docs/nat.md)."""

    slots: int = Field(0, description="members it relays now")
    max_slots: int = Field(0, description="members it may relay at once (--relay-slots; 0: it relays nobody)")
    connections: int = Field(0, description="connections it carried to them since its start")
    bytes: int = Field(0, description="bytes it carried for them since its start, both ways")
    refused: int = Field(0, description="reservations it refused: no slot left")


class PrivacyView(BaseModel):
    """A node's differential privacy (``--dp-epsilon``/``--dp-noise``; :mod:`dfl_node.learning.privacy`): what it
    has spent of its budget on its own data."""

    epsilon: float = Field(description="ε spent so far on the node's data, at delta (Opacus's RDP accountant)")
    delta: float = Field(description="the δ that epsilon is accounted at (--dp-delta)")
    budget: float | None = Field(default=None, description="the ε at which the node stops training on its data "
                                 "(--dp-epsilon; None: no budget)")
    noise_multiplier: float = Field(description="σ: each clipped gradient sum gets noise of std σ·clip")
    clip: float = Field(description="each sample's gradient is clipped to this L2 norm (--dp-clip)")
    exhausted: bool = Field(default=False, description="the budget stopped training on the node's data: it serves "
                            "its model and fuses what needs no data")


class DataStatus(BaseModel):
    """The node's own data (``--data``), as it trains on it now."""

    source: str = Field(description="the --data file or folder")
    train_samples: int = Field(description="training samples: the node's profile, which plans and weights read")
    val_samples: int = Field(description="local validation samples")
    files: int = Field(description="data files read")
    classes: int
    sample_shape: list[int]
    updated: float = Field(description="unix time the node last took new data (its start, until the data grows)")
    updates: int = Field(0, description="times the node took new data while running")
    bad_files: int = Field(0, description="data files skipped now: their newest version cannot be read")
    skipped_versions: int = Field(0, description="file versions skipped since the start (each logged once)")
    skipped: dict[str, str] = Field(default_factory=dict, description="skipped files (20 at most) and why")


class NodeStatus(Counters):
    """Snapshot of one node, as served by ``GET /status`` (the counters are inherited: top-level keys)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    swarm: str
    algorithm: str
    mode: Literal["round", "async"]
    model: str = Field(default="", description="this node's architecture, a registry spec (e.g. cnn-ln:32,64)")
    authentication: str = Field(default="none", description='how peers prove themselves (TLS with the swarm CA '
                                'of files: "mtls"; derived from a swarm key: "swarm-key"), or "none"')
    insecure: bool = Field(default=False, description="serving beyond loopback with no authentication (started with "
                           "--insecure): anyone who reaches the node can push a model into it")
    round: int
    role: str = Field(description='current role: "idle", "sender", "aggregator", "source", "candidate" or "holder"')
    peers: list[PeerInfo] = Field(default_factory=list)
    unreachable_peers: list[str] = Field(default_factory=list, description="static peers (--peer) whose last Hello "
                                         "got no answer (the name does not resolve, the port refuses, or silence); "
                                         "retried every heartbeat, the reason is in the log")
    task: str = Field(default="classification", description="what the node learns (--task): classification, "
                      "regression, anomaly, or a plugin's")
    metric: str = Field(default="accuracy", description="the task's headline metric, which local_accuracy and "
                        "global_accuracy hold (their names predate tasks): accuracy, rmse (lower is better), auc")
    local_accuracy: float | None = Field(default=None, description="the model's metric on its local validation "
                                         "split (None until evaluated)")
    global_accuracy: float | None = Field(default=None, description="the model's metric on the global test set "
                                          "(--test-data; None without one, or until evaluated)")
    privacy: PrivacyView | None = Field(default=None, description="differential privacy: the ε the node spent on "
                                        "its data, of its budget (None: no differential privacy)")

    rejected: dict[str, int] = Field(default_factory=dict, description="rejected transfers/hellos by reason")
    refused_peers: list[RefusedPeer] = Field(default_factory=list, description="peers refused at Hello (bounded), "
                                             "by this node or by the peer: with no live peer, the node has no "
                                             "compatible peer")
    version: str = __version__
    boot_id: str
    uptime_s: float
    grpc_address: str
    http_port: int
    param_sha256: str | None = Field(default=None, description="sha256 of the node's current parameters")
    fusing: bool = False
    max_concurrent_fusions: int = Field(default=0, description="most fusions ever running at once (must stay ≤ 1)")
    epoch: int = Field(default=0, description="round mode: epoch of the newest round token seen (fencing)")
    holding: bool = Field(default=False, description="round mode: this node holds the round token (also while it "
                          "plays a role itself, when role names that role)")
    done: bool = Field(default=False, description="the node reached its round/time budget")
    data: DataStatus | None = Field(default=None, description="the node's own data: samples, files, last change")
    work_s: float = Field(default=0.0, description="seconds of computation the node's last role took (its estimate "
                          "before any role, from its first evaluation; 0: unknown): a holder's deadlines follow it")
    max_upload: float = Field(default=0.0, description="bytes/s its model transfers may send at most (0: no cap)")
    max_download: float = Field(default=0.0, description="bytes/s its model transfers may receive at most (0: no cap)")
    reachability: Literal["unknown", "direct", "relayed", "unreachable"] = Field(
        default="unknown", description='whether peers can dial it: "direct" (a member dialed it back), "relayed" '
        '(behind NAT: peers reach it through relay, at grpc_address), "unreachable" (no relay found yet), '
        '"unknown" (not asked yet)')
    relay: str | None = Field(default=None, description="the member that relays it (reachability relayed)")
    relaying: RelayView = Field(default_factory=RelayView, description="what it carries as a relay for others")

    @property
    def counters(self) -> Counters:
        """The flattened counter fields, grouped again."""
        return Counters(**{name: getattr(self, name) for name in COUNTER_FIELDS})
