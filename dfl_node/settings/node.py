"""A node's settings (:class:`NodeConfig`), by the part of the node that reads them: its data (``local``), how it
learns (``learning``) and its algorithm's own settings (``per_algorithm``), what it refuses to fuse
(``defences``), its network, its membership (how it
finds its peers and knows they live), its schedule, its roles, its evaluation, its REST API and its storage.

Every setting is a ``dfl-node start`` flag (``--grpc-port`` for ``grpc_port``), a ``DFL_<KEY>`` environment
variable (``DFL_GRPC_PORT``; lists comma-separated, e.g. ``DFL_PEERS``) and a config-file key, flat, with the
precedence of :func:`dfl_node.settings.loading.load_config`; inside the program it is its part's
(``config.network.grpc_port``: :mod:`dfl_node.settings.parts`), and each part of a node is handed its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dfl_node.addresses import is_loopback, parse_peer
from dfl_node.learning.algorithm_settings import (
    DATASET_DEPENDENT,
    AlgorithmOptions,
    DefenceSettings,
    SharedSettings,
    gates_refusal,
    privacy_refusal,
)
from dfl_node.learning.data_format import DataFormat
from dfl_node.rates import parse_cap
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.names import WIRE_DTYPE_HELP, AlgorithmName, WireDtype
from dfl_node.settings.parts import Composite


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _names_port(address: str) -> bool:
    """Whether an advertised address names its port (``HOST:PORT``, ``[IPv6]:PORT``) rather than a host alone."""
    return address.startswith("[") or address.count(":") == 1


class DataSettings(DataFormat):
    """This device's data, and how it is read."""

    data: Path = Field(..., description="this node's data: a .csv, .npz or .safetensors file, or a folder of them "
                       "(read again as files are added or grow; val.* files validate), e.g. a shard folder of "
                       "dfl-node partition; see docs/data.md")
    test_data: Path | None = Field(None, description="global test set, a .safetensors, .csv or .npz file, for global "
                                   "accuracy")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="share of the samples held out for local validation "
                                "where the data has no val.* file: stratified, seeded, and stable as the data grows")
    max_samples: int = Field(0, ge=0, description="keep the newest this many samples of the training files (0: all)")
    data_poll: float = Field(5.0, ge=0, description="seconds between looks at --data for added or grown files, taken "
                             "from the next round on (0: read once, at start)")


class NetworkSettings(_Part):
    """Where the node serves its peers, how it proves who it is, and what its links may cost."""

    host: str = Field("127.0.0.1", description="address to serve on; loopback unless told otherwise")
    advertise: str | None = Field(None, description="address peers should dial, HOST or HOST:PORT (default: host and "
                                  "--grpc-port; required with 0.0.0.0): a port other than --grpc-port where a router "
                                  "forwards one, a load balancer or a container publishes it")
    grpc_port: int = Field(50051, ge=1, le=65535, description="port peers stream models to (gRPC)")
    reflection: bool = Field(False, description="serve gRPC server reflection (for grpcurl): a debugging aid that "
                             "describes every service to anyone who reaches the gRPC port")
    tls_dir: Path | None = Field(None, description="mutual TLS: folder with ca.crt, node.crt and node.key (what "
                                 "`dfl-node certs issue` writes); serve and dial only with certificates the swarm "
                                 "CA signed, whose CN is the node id")
    tls_ca: Path | None = Field(None, description="mutual TLS: the swarm CA certificate (default: TLS_DIR/ca.crt)")
    tls_cert: Path | None = Field(None, description="mutual TLS: this node's certificate, CN and DNS name = its id "
                                  "(default: TLS_DIR/node.crt)")
    tls_key: Path | None = Field(None, description="mutual TLS: this node's private key (default: TLS_DIR/node.key)")
    swarm_key_file: Path | None = Field(None, description="swarm-key mode: a file with the swarm's pre-shared key "
                                        "(`dfl-node certs swarm-key`), or two lines, the current key then the next "
                                        "(a rollover): mutual TLS with a swarm CA derived from the key, each node "
                                        "issuing its own certificate at start; not with --tls-dir")
    insecure: bool = Field(False, description="serve beyond loopback with neither mutual TLS nor a swarm key, so "
                           "that anyone who reaches --host can push a model into this node (and REST with no "
                           "token): only on a private network (a testbed's bridge). Without it such a node refuses "
                           "to start")
    connect_timeout: float = Field(5.0, gt=0, description="a call to a peer that accepts no connection within this "
                                   "many seconds fails: a sender (or pulling aggregator) gives its role back, a "
                                   "holder plays the group again")
    stream_timeout: float = Field(30.0, gt=0, description="an incoming model stream silent this long is dropped "
                                  "(it never holds a role or a buffer)")
    wire_dtype: WireDtype = Field("exact", description=WIRE_DTYPE_HELP)
    relay: str = Field("auto", description="auto: find out whether peers can dial this node (a member dials it "
                       "back) and, if not, hold a slot on a member that peers can dial, and be reached through it; "
                       "off: do not ask (peers dial it directly); HOST:PORT: always through this relay")
    relay_slots: int = Field(16, ge=0, description="members that peers cannot dial this node relays at most (it "
                             "relays only when peers dial it directly; 0: never)")
    relay_rate: float = Field(0.0, ge=0, description="bytes/s the connections it relays carry at most, all together "
                              "(e.g. 1M; 0: no cap)")
    relay_bytes: float = Field(0.0, ge=0, description="bytes it carries as a relay at most since its start (e.g. "
                               "20G; 0: no bound): spent, it gives its slots back and takes no more, and the members "
                               "it relayed move to another relay")
    max_upload: float = Field(0.0, ge=0, description="bytes/s this node's model transfers may send at most, all "
                              "peers together (e.g. 100k, 1.5M; 0: no cap): a metered or shared uplink")
    max_download: float = Field(0.0, ge=0, description="bytes/s its model transfers may receive at most (e.g. 100k, "
                                "1.5M; 0: no cap)")

    @field_validator("relay")
    @classmethod
    def _relay(cls, value: str) -> str:
        if value not in ("auto", "off"):
            parse_peer(value)
        return value

    @field_validator("max_upload", "max_download", "relay_rate", "relay_bytes", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        """A cap as written: bytes/s or bytes (``0``: none), or ``100k``, ``1.5M``, ``20G``."""
        return parse_cap(value) if isinstance(value, str) else value

    @property
    def authenticated(self) -> bool:
        """Whether peers must prove who they are (mutual TLS with files, or with a swarm key's CA)."""
        return any(path is not None for path in (self.tls_dir, self.tls_ca, self.tls_cert, self.tls_key,
                                                 self.swarm_key_file))

    @property
    def open_to_network(self) -> bool:
        """Serving beyond loopback while peers prove nothing (no mTLS, no swarm key)."""
        return not self.authenticated and not is_loopback(self.host)

    @field_validator("advertise")
    @classmethod
    def _host_or_address(cls, value: str | None) -> str | None:
        """``HOST`` or ``HOST:PORT``: a port, if given, must be one (a typo must stop the start)."""
        if value is not None and _names_port(value):
            parse_peer(value)
        return value

    @property
    def advertised_host(self) -> str:
        if self.advertise:
            return parse_peer(self.advertise)[0] if _names_port(self.advertise) else self.advertise
        if self.host in ("0.0.0.0", "::"):
            raise ValueError("--host 0.0.0.0 needs --advertise ADDR: the address peers should dial")
        return self.host

    @property
    def advertised_port(self) -> int:
        """The port peers dial: ``--advertise``'s, if it names one, else ``--grpc-port``."""
        return parse_peer(self.advertise)[1] if self.advertise and _names_port(self.advertise) else self.grpc_port

    @property
    def address(self) -> str:
        """host:port where peers reach this node."""
        host = self.advertised_host
        return f"[{host}]:{self.advertised_port}" if ":" in host else f"{host}:{self.advertised_port}"


class MembershipSettings(_Part):
    """How the node finds its peers and knows they still live."""

    peers: list[str] = Field(default_factory=list, description="static peers HOST:PORT (networks without multicast)")
    join: list[str] = Field(default_factory=list, description="join the fleet through a member at HOST:PORT (any "
                            "one; the rest is learned from it); retried with backoff until a join succeeds")
    mdns: bool = Field(True, description="discover peers by mDNS on the serving interface")
    heartbeat: float = Field(1.0, gt=0, description="the membership's probe period: seconds between two probes "
                             "of one member by this node (SWIM; see docs/membership.md)")
    peer_timeout: float = Field(4.0, gt=0, description="the shortest suspicion: a suspect member unconfirmed this "
                                "long (times log10 of the fleet's size, at least 1) is declared dead")
    ping_timeout: float = Field(0.5, gt=0, description="a probed member silent this long is probed indirectly")
    indirect_probes: int = Field(3, ge=0, le=16, description="members asked to probe a silent member before it is "
                                 "suspected")
    suspicion_max: float = Field(6.0, ge=1, description="an unconfirmed suspicion waits up to this many times the "
                                 "shortest (Lifeguard: fewer false deaths of slow members)")
    retransmit_mult: int = Field(4, ge=1, le=64, description="each membership change is gossiped this many times "
                                 "log10 of the fleet's size")
    sync_interval: float = Field(30.0, gt=0, description="seconds between two exchanges of whole membership views "
                                 "with a random member (longer beyond 32 members)")
    peer_expiry: float = Field(300.0, gt=0, description="a peer silent this long is forgotten (it rejoins when it "
                               "answers again)")
    max_pending_peers: int = Field(32, ge=1, description="peers that said Hello but have not yet answered ours, "
                                   "at most (more are refused: peer_table_full)")

    @field_validator("peers", "join", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return [p for p in value.split(",") if p] if isinstance(value, str) else value

    @field_validator("peers", "join")
    @classmethod
    def _host_port(cls, peers: list[str]) -> list[str]:
        """A static peer or a join address is dialled as HOST:PORT: a typo must stop the start, not become a
        silent dead peer."""
        for peer in peers:
            parse_peer(peer)
        return peers


class ScheduleSettings(_Part):
    """When the node plays a round: the round token's (round mode) or its own volunteering (async mode)."""

    mode: Literal["round", "async"] = Field("round", description="round: token-scheduled, reproducible; "
                                            "async: deployment")
    min_peers: int = Field(1, ge=1, description="round mode: peers the lowest id waits for before round 0")
    rounds: int = Field(0, ge=0, description="round mode: stop after T rounds (0: run until stopped)")
    participation: float = Field(1.0, gt=0, le=1, description="async mode: probability of volunteering per tick")
    interval: float = Field(1.0, gt=0, description="async mode: seconds between volunteering ticks")
    duration: float = Field(0.0, ge=0, description="async mode: how long this node volunteers, in seconds "
                            "(0: until it is stopped)")
    exit_when_done: bool = Field(False, description="exit (code 0) once done: --rounds reached, or --duration over; "
                                 "for a batch job or a script step")
    round_timeout: float = Field(120.0, gt=0, description="round mode: the shortest deadline of a group (one "
                                 "pairing): a holder gives a group 3 times the computation its members' last roles "
                                 "took (their profile), at least this and at most --max-round-timeout")
    max_round_timeout: float = Field(1800.0, gt=0, description="the longest deadline a group is given, however slow "
                                     "its members (it also caps the deadline any Assign may ask of this node)")
    group_attempts: int = Field(2, ge=1, description="round mode: a group that fails this many times while its "
                                "members live on (a link that cannot carry its model, a device too slow for its "
                                "deadline) is planned around: the holder plays the round again without its members")
    round_window: int = Field(1000, ge=1, description="an Assign for a round more than this many rounds ahead of "
                              "the fleet's progress as this node knows it is refused (round_window)")
    token_timeout: float = Field(10.0, gt=0, description="round mode: silence after which a lost token is regenerated")

    @model_validator(mode="after")
    def _deadlines_in_order(self) -> ScheduleSettings:
        if self.max_round_timeout < self.round_timeout:
            raise ValueError(f"--max-round-timeout ({self.max_round_timeout:g} s) is shorter than --round-timeout "
                             f"({self.round_timeout:g} s)")
        return self

    @model_validator(mode="after")
    def _done_needs_an_end(self) -> ScheduleSettings:
        if self.exit_when_done and not (self.rounds if self.mode == "round" else self.duration):
            raise ValueError("--exit-when-done needs an end: --rounds (round mode) or --duration (async mode)")
        return self


class RoleSettings(_Part):
    """How the node plays a role: what a selecting sender waits for, what an aggregator buffers and refuses."""

    probe_timeout: float = Field(10.0, gt=0, description="defkt-select: a candidate that has not answered a "
                                 "sender's selection probe after this many seconds is skipped (and counted)")
    max_buffered_mb: float = Field(2048.0, gt=0, description="an aggregator buffers at most this many MB of received "
                                   "models at once; further senders are refused (over_memory)")
    min_accuracy: float = Field(0.0, ge=0, le=1, description="refuse a received whole model whose accuracy on this "
                                "node's validation split is below this (low_accuracy); 0: no accuracy gate")
    resume_window: float = Field(10.0, ge=0, description="a model transfer cut mid-stream resumes: its receiver keeps "
                                 "what arrived this many seconds, and its sender tries again while the receiver holds "
                                 "more than it did this many seconds before (0: a cut transfer fails, as a refusal)")


class EvaluationSettings(_Part):
    """When the node measures its model."""

    evaluate: bool = Field(True, description="evaluate local/global accuracy (on a schedule: --eval-every)")
    eval_every: int = Field(1, ge=1, description="round mode: evaluate the model that stands at every n-th round "
                            "(the points of the accuracy curve) and at the end; 1: after every change (async mode "
                            "always). A model is evaluated before the next change replaces it: no point is missed")


class ApiSettings(_Part):
    """The REST API: status, fleet page, metrics, the model served."""

    http_port: int = Field(8080, ge=0, le=65535, description="REST status port (0 disables the REST server)")
    http_host: str = Field("127.0.0.1", description="address the REST API binds: loopback unless told otherwise, "
                           "whatever --host says (whoever reaches it reads the node's status and its trained model, "
                           "and may ask for predictions; nothing it serves changes the node): beyond loopback it "
                           "needs --http-token-file, or --insecure")
    http_token_file: Path | None = Field(None, description="a file with the REST API's bearer token (`dfl-node certs "
                                         "http-token FILE`): every route but /healthz then answers 401 without "
                                         "'Authorization: Bearer TOKEN'; the dashboard asks for it once")

    @property
    def open_to_network(self) -> bool:
        """Serving REST beyond loopback with no token."""
        return self.http_port != 0 and self.http_token_file is None and not is_loopback(self.http_host)
    status_url: str | None = Field(None, max_length=200, pattern=r"^https?://[^\s/]+(/\S*)?$",
                                   description="URL operators reach this node's REST API at, told to peers for "
                                               "`dfl-node status --all` (default: http://ADVERTISE:HTTP_PORT); "
                                               "set it where the port is published elsewhere (compose, port-forward)")


class StorageSettings(_Part):
    """The node's state folder: its checkpoints and its history."""

    state_dir: Path | None = Field(None, description="checkpoint folder (default ./dfl-state/<id>)")
    history_limit: int = Field(2048, ge=1, description="/history and the checkpoint keep this many newest events "
                               "(bounded: a node that runs forever rewrites a bounded state file)")
    fsync: bool = Field(True, description="write checkpoints through to the disk, so that they survive a power cut "
                        "and not only a crash; off only for the simulator's in-process fleets")


class NodeConfig(Composite):
    """One node's settings: who it is and what it runs, and its parts' settings."""

    parts = ("local", "learning", "per_algorithm", "defences", "schedule", "network", "api", "membership", "storage",
             "roles", "evaluation")

    id: str = Field(..., min_length=1, max_length=48, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                    description="node id, unique in the swarm")
    algorithm: AlgorithmName = Field("defkt", description="algorithm this node runs, the same on every node: a "
                                     "built-in or an installed plugin's (entry-point group dfl_node.algorithms; "
                                     "`dfl-node plugins` lists them)")
    swarm: str = Field("default", min_length=1, max_length=32, description="only peers of the same swarm talk")
    local: DataSettings
    learning: SharedSettings = Field(default_factory=SharedSettings)
    per_algorithm: AlgorithmOptions = Field(default_factory=AlgorithmOptions)
    defences: DefenceSettings = Field(default_factory=DefenceSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    membership: MembershipSettings = Field(default_factory=MembershipSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    roles: RoleSettings = Field(default_factory=RoleSettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)

    @classmethod
    def for_experiment(cls, experiment: ExperimentConfig, **settings: Any) -> NodeConfig:
        """A node of ``experiment``'s fleet: every setting the two share (how it learns, each algorithm's own, the
        data's format, the wire), then ``settings`` (flat keys)."""
        shared = experiment.flat(keys=cls.flat_fields().keys())
        return cls.model_validate({**shared, **settings})

    @model_validator(mode="after")
    def _open_only_when_told(self) -> NodeConfig:
        """Off loopback, an unauthenticated node fuses whatever model a stranger sends it (one Assign and one
        Transfer): that must be the operator's explicit choice, never a default (p2pfl's silent fallback)."""
        if self.network.open_to_network and not self.network.insecure:
            raise ValueError(f"host {self.network.host} is reachable from the network but neither mutual TLS "
                             "(--tls-dir) nor a swarm key (--swarm-key-file) is set, so anyone there could push a "
                             "model into this node; give one, or --insecure (DFL_INSECURE=1) on a private network")
        if self.api.open_to_network and not self.network.insecure:
            raise ValueError(f"the REST API on {self.api.http_host} is reachable from the network without a token, so "
                             "anyone there could take this node's model and spend its CPU on predictions; give "
                             "--http-token-file (`dfl-node certs http-token FILE`), or --insecure (DFL_INSECURE=1) "
                             "on a private network")
        return self

    @model_validator(mode="after")
    def _algorithm_learns_the_task(self) -> NodeConfig:
        if self.learning.task != "classification":
            from dfl_node.algorithms import check_task  # noqa: PLC0415 - torch out of settings

            check_task([self.algorithm], self.learning.task)
        gates_refusal(self.learning.task, min_accuracy=self.roles.min_accuracy,
                      relative_gate=self.defences.relative_gate)
        privacy_refusal(self.learning, self.per_algorithm, [self.algorithm])
        return self

    @model_validator(mode="after")
    def _dataset_defaults(self) -> NodeConfig:
        """Batch sizes and learning rate not given are those the node's shard carries (``dfl-node partition``, a
        testbed): its dataset's, or, for a dataset of the user's own, the fleet's, so the nodes of a fleet
        partitioned together resolve alike, and whatever reads this config sees the values in use. Given all
        three, no shard is read; data that carries none has them sized to it once read
        (:class:`~dfl_node.node.model.data_watch.NodeData`)."""
        if not set(DATASET_DEPENDENT) <= self.learning.model_fields_set:
            from dfl_node.learning.provision import node_defaults  # noqa: PLC0415 - torch only to read a shard

            self.learning.use_defaults(node_defaults(self.local.data))
        return self

    def unusable_here(self) -> dict[str, str]:
        return self.learning.unusable_here()

    @property
    def state_path(self) -> Path:
        return self.storage.state_dir or Path("dfl-state") / self.id
