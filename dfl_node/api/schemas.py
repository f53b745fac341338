"""What a node reports over REST: pydantic models the daemon fills.

The daemon builds a :class:`NodeStatus` on demand (``GET /status``) and keeps a list of
:class:`HistoryEntry` (``GET /history``). Both are plain data: nothing here touches the node.

Counters are exposed **flattened at the top level** of :class:`NodeStatus` (``models_sent``,
``bytes_received``, …) because that is the shape clients and the issue ask for; the daemon can keep
a :class:`Counters` object internally and splat it in (``NodeStatus(**counters.model_dump(), …)``),
and :attr:`NodeStatus.counters` gives the grouped view back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dfl_node import __version__

__all__ = ["Counters", "DataStatus", "Detection", "Estimate", "FleetEvent", "FleetMember", "FleetView", "HistoryEntry",
           "LinkReport", "ModelInfo", "NodeStatus", "PeerInfo", "Prediction", "Predictions", "RefusedPeer", "RelayView",
           "TokenView"]


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


class RelayView(BaseModel):
    """What a node carries as a relay for members their peers cannot dial (docs/nat.md)."""

    slots: int = Field(0, description="members it relays now")
    max_slots: int = Field(0, description="members it may relay at once (--relay-slots; 0: it relays nobody)")
    connections: int = Field(0, description="connections it carried to them since its start")
    bytes: int = Field(0, description="bytes it carried for them since its start, both ways")
    refused: int = Field(0, description="reservations it refused: no slot left")


class Counters(BaseModel):
    """Monotonic traffic/work counters of a node (since its state was created, survive restarts)."""

    models_sent: int = 0
    models_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    fusions: int = 0
    rounds_completed: int = 0
    busy_refusals: int = 0
    senders_abandoned: int = 0  # senders an aggregator left out: their transfer never came (in time)
    groups_abandoned: int = 0  # round mode, as holder: groups whose members, alive, refused for a round_timeout
    probes_sent: int = 0  # client selection (001): probes this node sent to candidate receivers
    probes_unanswered: int = 0  # … of which no valid answer came in time (skipped: silent, refused, invalid)
    probes_answered: int = 0  # probes this node answered as a candidate
    transfers_cut: int = 0  # model streams a link cut mid-way, at either end (resumed where they could be)
    bytes_resent: int = 0  # bytes this node sent again because a stream was cut
    groups_replanned: int = 0  # round mode, as holder: groups that failed group_attempts times, planned around
    rounds_held: int = 0  # round mode: rounds this node played as the token's holder (planned, saw fused)


COUNTER_FIELDS = tuple(Counters.model_fields)


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


class SeriesAccuracy(BaseModel):
    """Accuracies of another model a node reports beside its own (DFML's regular model, FML's meme model)."""

    local_accuracy: float | None = None
    global_accuracy: float | None = None


class HistoryEntry(BaseModel):
    """One event in the node's history (``GET /history``)."""

    round: int
    time: float = Field(description="unix time of the event")
    event: str = Field(description='"fusion", "train", "eval", …')
    role: str
    peer: str | None = None
    local_accuracy: float | None = None
    global_accuracy: float | None = None
    series: dict[str, SeriesAccuracy] = Field(default_factory=dict, description="where evaluated, the algorithm's "
                                              "other reported models, by name (DFML: regular; FML: meme)")
    bytes_received: int = Field(0, description="model bytes this node had received by then: summed over a fleet, "
                                "the bytes that crossed its wire")
    detail: dict[str, float | int | str] = Field(default_factory=dict)


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


class ModelInfo(BaseModel):
    """``GET /model/info``: the model ``/model`` serves and ``/predict`` answers with, and what a request may hold."""

    spec: str = Field(description="the architecture, a registry spec (e.g. mlp:32,32)")
    sample_shape: list[int] = Field(description="the shape of one sample: (F,), (C, L), (C, H, W)…")
    num_classes: int = Field(description="the model's output width: classes (classification), targets (regression), "
                             "a sample's values (anomaly: an autoencoder's reconstruction)")
    task: str = Field(default="classification", description="what /predict answers: classification (a class and "
                      "probabilities), anomaly (a score and a flag), regression or another task (the values)")
    threshold: float | None = Field(default=None, description="anomaly: a sample is flagged where its score exceeds "
                                    "it (a quantile of the node's validation scores for this model)")
    fingerprint: str = Field(description="sha256 of the architecture and its tensor names, shapes and dtypes")
    node: str
    round: int = Field(description="rounds the node had completed when this model was checkpointed")
    sha256: str = Field(description="digest of the weights (param_sha256 of /status, for the node's own model)")
    max_batch: int = Field(description="the most samples one /predict request may hold")
    max_body_bytes: int = Field(description="the largest /predict body accepted")


class Prediction(BaseModel):
    """One sample's answer of a classifier."""

    model_config = ConfigDict(populate_by_name=True)

    class_: int = Field(alias="class", description="the most probable class")
    probability: float = Field(description="its probability")
    probabilities: list[float] = Field(description="every class's probability (softmax of the logits)")


class Estimate(BaseModel):
    """One sample's answer of a regressor (or of a plugin's task): the model's outputs."""

    values: list[float] = Field(description="the predicted targets (num_classes of /model/info)")


class Detection(BaseModel):
    """One sample's answer of an anomaly detector."""

    score: float = Field(description="its anomaly score: the mean squared error of the model's reconstruction")
    flag: bool = Field(description="anomalous: the score exceeds the model's threshold (/model/info)")


class Predictions(BaseModel):
    """``POST /predict``'s answer: per sample, in the request's order, and the model that gave it."""

    node: str
    round: int
    sha256: str = Field(description="digest of the weights that answered (as /model/info says)")
    predictions: list[Prediction] | list[Estimate] | list[Detection] = Field(description="by the model's task "
                                                                             "(/model/info): one kind for all")
