"""The messages of the peer network port, as frozen dataclasses.

Each mirrors one message of ``proto/dfl/v1/dfl.proto`` field by field, under the same names (so
:mod:`dfl_node.net.convert` converts them generically) and with protobuf's defaults (so a message
that leaves a field out means what it means on the wire). What only the wire needs stays on the wire:
the payload hashes a Hello or a pull offers,
a transfer's manifest and digest (:mod:`dfl_node.net.manifest`). Maps are typed as read-only mappings and
repeated fields are tuples: a message that crossed to a node is never changed there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Where a node stands, as every Hello and HelloReply says: read when a token is lost (round mode) and shown
    on fleet pages (both modes)."""

    round: int = 0  # rounds completed as far as this node knows
    epoch: int = 0  # the newest token epoch it has seen
    holding: bool = False  # it holds the token of that epoch now
    done: bool = False  # the fleet reached its last round
    state: Mapping[str, str] = field(default_factory=dict)  # the algorithm state the token for ``round`` carries
    busy: bool = False  # it plays a role now: its fusion may still complete a round
    role: str = ""  # for fleet pages: its role now
    local_accuracy: float | None = None  # for fleet pages: None until evaluated
    global_accuracy: float | None = None


@dataclass(frozen=True, kw_only=True)
class Hello:
    """Who a node is: sent first to any peer, so an incompatible one fails before any transfer."""

    protocol_version: int = 0
    swarm: str = ""
    node_id: str = ""
    fingerprint: str = ""  # model fingerprint (architecture + names, shapes, dtypes)
    algorithm: str = ""
    boot_id: str = ""  # changes at every start of the process: a new one means the node restarted
    grpc_address: str = ""  # where the node serves its peers
    http_port: int = 0
    status_url: str = ""
    model: str = ""  # architecture spec, e.g. "cnn-ln:32,64"
    num_samples: int = 0  # training samples: the node's profile, read by round plans
    wire_dtype: str = ""  # how its floating tensors travel (dfl_node.peering.wire_dtypes); "": exact, an older node
    progress: Progress = field(default_factory=Progress)  # where it stands: a Hello is a heartbeat both ways
    sample_shape: tuple[int, ...] = ()  # one sample's shape in its data; (): an older node
    num_classes: int = 0  # the classes of its data; 0: an older node
    work_s: float = 0.0  # seconds of computation its last role took (its estimate before any role; 0: unknown)
    relay: str = ""  # the member through which it is reached ("": directly); grpc_address is then its slot there
    direct: bool = False  # a member dialed it back at grpc_address: it may dial others back, and relay them
    task: str = ""  # what it learns (dfl_node.learning.tasks); "": classification (a classifier's Hello as it was)


@dataclass(frozen=True, kw_only=True)
class HelloReply(Hello):
    """A peer's answer to our Hello: its own identity and progress, and whether it accepts us."""

    accepted: bool = False
    reason: str = ""  # short stable code when not accepted, e.g. "swarm_mismatch"


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """A member's role in one group of round ``round``, from the token holder or an inviting volunteer."""

    round: int = 0  # async mode: the aggregator's own exchange counter
    epoch: int = 0  # token epoch (fencing); 0 in async mode
    holder: str = ""  # the token holder (async mode: the aggregator)
    role: str = ""  # "sender" or "aggregator" (dfl_node.algorithms.plan.Role)
    aggregator: str = ""
    aggregator_address: str = ""  # where a sender pushes
    state: Mapping[str, str] = field(default_factory=dict)  # the round plan's algorithm state (Step.state)
    senders: tuple[str, ...] = ()  # the group's senders (sources, for a pull)
    pull: bool = False  # the aggregator pulls from the senders instead
    deadline_s: float = 0.0  # aggregator: longest wait for the senders' messages
    candidates: tuple[str, ...] = ()  # an open group (001): the sender chooses its aggregator among these
    # where the members and candidates serve, as the holder knew it
    addresses: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Token:
    """The round-mode token; exactly one lives per epoch."""

    round: int = 0  # the round its receiver plans
    epoch: int = 0  # fencing number; bumped when the token is regenerated
    holder: str = ""  # the new holder
    seed: int = 0
    state: Mapping[str, str] = field(default_factory=dict)  # the last round plan's algorithm state
    members: tuple[str, ...] = ()  # the fleet as the sender knew it
    done: bool = False  # the fleet reached its last round: stop


@dataclass(frozen=True, kw_only=True)
class Ack:
    ok: bool = False
    reason: str = ""  # short stable code when not ok, e.g. "stale_epoch"


@dataclass(frozen=True, kw_only=True)
class PullRequest:
    """An aggregator asks a source for its model (a pull group)."""

    aggregator: str = ""
    swarm: str = ""
    round: int = 0
    epoch: int = 0
    state: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Offer:
    """What a pushed model announces before its payload: the receiver decides from it whether it wants it."""

    sender: str = ""
    round: int = 0
    epoch: int = 0
    purpose: str = ""  # e.g. "defkt.model"
    model: str = ""  # the architecture spec of what it carries
    total_size: int = 0  # payload bytes that follow
    digest: bytes = b""  # what identifies the payload (over gRPC its digest): a resumed transfer names the same
    resume: bool = False  # it resumes a transfer that was cut: the receiver says what it still holds of it


@dataclass(frozen=True, kw_only=True)
class DialBackRequest:
    """A node asks a member to dial it back at ``address`` (where it says it serves): whether peers can reach it."""

    sender: str = ""
    address: str = ""
    timeout_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ReserveRequest:
    """A member its peers cannot dial asks a reachable one for a relay slot."""

    sender: str = ""
    swarm: str = ""


MAX_UPDATES = 16  # updates a membership ping or ack may carry (its sender's own state and at most 8 of gossip)
MAX_MEMBERS = 2048  # members a push-pull may carry: about 0.5 MB, half what a gRPC message may be
MAX_ID = 128  # characters of a member's node id (and a suspicion's sender) in an update
MAX_ADDRESS = 256  # characters of a member's address in an update


@dataclass(frozen=True, kw_only=True)
class MemberUpdate:
    """One member's state as the membership's gossip spreads it (SWIM, :mod:`dfl_node.node.membership.swim`): a newer
    ``incarnation`` wins, and at the same one dead beats suspect beats alive. An alive update carries the
    member's Hello: its identity, its profile (architecture, sample count) and its round progress."""

    state: str = ""  # "alive", "suspect" or "dead"
    incarnation: int = 0  # the member's own counter: it bumps it to refute a suspicion or to announce a change
    node_id: str = ""
    sender: str = ""  # suspect or dead: who says so (each suspecter confirms a suspicion once)
    hello: Hello = field(default_factory=Hello)  # alive: the member's own Hello (else empty)


@dataclass(frozen=True, kw_only=True)
class Ping:
    """A membership probe, with gossip piggybacked. ``target`` empty: the receiver is probed; otherwise the
    receiver is asked to probe ``target`` (at ``target_address``) for us within ``timeout_s`` (an indirect
    probe). ``sync``: ``updates`` are the sender's whole view, and the ack carries the receiver's, less what the
    sender's view says of a member at the incarnation and state the receiver holds (a push-pull)."""

    sender: str = ""
    target: str = ""
    target_address: str = ""
    timeout_s: float = 0.0
    sync: bool = False
    updates: tuple[MemberUpdate, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PingAck:
    """The answer to a :class:`Ping`: whether the probed member answered, and gossip."""

    ok: bool = False
    updates: tuple[MemberUpdate, ...] = ()
