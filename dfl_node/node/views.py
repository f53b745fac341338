"""What the REST API shows of a node: its status (``GET /status``) and the fleet as it knows it (``GET
/fleet``): itself, each peer as of its last answer to our Hello, the round token's holder and how long it has
held it, and the node's recent sends, fusions and refusals.

Everything comes from what the node's parts already have — its membership's view of each peer (every HelloReply
carries the peer's round, role, accuracy and whether it holds the token) and its own progress, roles, model and
tally — so a fleet page costs no request to another node and shows the fleet even where the browser cannot reach
the peers. The views read the parts (:class:`Observed`); they change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Protocol

from dfl_node.algorithms.plan import Role
from dfl_node.learning.privacy import PrivateTraining
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.link_quality import LinkQuality
from dfl_node.node.exchange.roles import Roles
from dfl_node.node.membership.membership import Membership
from dfl_node.node.membership.peer_record import Peer
from dfl_node.node.membership.reach import Reach
from dfl_node.node.model.data_watch import NodeData
from dfl_node.node.model.learner import Learner
from dfl_node.peering.port import PeerNetwork
from dfl_node.records.counters import COUNTER_FIELDS
from dfl_node.records.fleet import FleetMember, FleetView, TokenView
from dfl_node.records.formatting import Figure, figure
from dfl_node.records.status import NodeStatus, PrivacyView, RelayView
from dfl_node.records.urls import peer_url
from dfl_node.settings.node import NodeConfig


class Observed(Protocol):
    """What the views read of a node (:class:`~dfl_node.node.node.Node`)."""

    config: NodeConfig
    boot_id: str
    started: float
    clock: Clock
    network: PeerNetwork
    progress: RoundProgress
    roles: Roles
    membership: Membership
    learner: Learner
    tally: Tally
    data: NodeData
    links: LinkQuality
    reach: Reach

MAX_ROLE_CHARS = 32  # a peer's role is its word: shown, never trusted to be short


def _peer_member(peer: Peer, base_url: str, links: LinkQuality, headline: Figure) -> FleetMember:
    """``peer`` as of its last answer to our Hello; the figures it claims are of ``headline`` (a fleet learns one
    task), shown where they can be (a hostile peer's NaN, or an accuracy of 7.5, shows as unknown)."""
    progress = peer.progress
    url = peer_url({"status_url": peer.status_url, "http_port": peer.http_port or None, "address": peer.address},
                   base_url)
    return FleetMember(
        id=peer.id, status_url=url, grpc_address=peer.address, alive=peer.alive, last_seen=peer.last_seen,
        algorithm=peer.algorithm or None, model=peer.model or None, work_s=peer.work_s or None,
        link=links.report(peer.id), relay=peer.relay or None,
        **({} if progress is None else {
            "round": progress.round, "role": progress.role[:MAX_ROLE_CHARS] or None, "holding": progress.holding,
            "done": progress.done, "local_accuracy": headline.plausible(progress.local_accuracy),
            "global_accuracy": headline.plausible(progress.global_accuracy)}),
    )


def _token(node: Observed, peers: Iterable[Peer]) -> TokenView | None:
    """Round mode: who holds the token, as far as this node knows. A peer's claim is as old as its last
    reply to our Hello, so several can say they hold it (the token has moved on since); the newest claim
    wins: the highest epoch, then the highest round, this node's own (current) on a tie."""
    if node.config.schedule.mode != "round":
        return None
    now, state = node.clock.wall(), node.progress
    claims = [(state.epoch, state.round, 1, node.config.id, state.holding_since)] if state.holding else []
    claims += [(p.progress.epoch, p.progress.round, 0, p.id, p.holding_since) for p in peers
               if p.alive and p.progress is not None and p.progress.holding]
    if not claims:
        return TokenView(holder=None, epoch=state.epoch, since=now, age_s=0.0)
    epoch, _, _, holder, since = max(claims, key=lambda claim: claim[:3])
    since = since if since is not None else now
    return TokenView(holder=holder, epoch=epoch, since=since, age_s=max(0.0, now - since))


def fleet_view(node: Observed) -> FleetView:
    """What ``GET /fleet`` serves for ``node``."""
    status = node_status(node)
    own_url = rest_url(node.config)
    me = FleetMember(id=status.id, is_self=True, status_url=own_url, grpc_address=status.grpc_address, alive=True,
                     round=status.round, role=status.role, local_accuracy=status.local_accuracy,
                     global_accuracy=status.global_accuracy, holding=status.holding, done=status.done,
                     algorithm=status.algorithm, model=status.model or None, work_s=status.work_s or None,
                     relay=status.relay)
    peers = node.membership.known()
    headline = figure(status.metric)
    members = [me, *(_peer_member(p, own_url or "http://127.0.0.1", node.links, headline) for p in peers)]
    token = _token(node, peers)
    for member in members:  # one holder: the others' claims are older than the token's last hand-over
        member.holding = token is not None and member.id == token.holder
        if member.role == "holder" and not member.holding:  # "holder" is an idle node's holding: stale too
            member.role = "idle"
    return FleetView(node=status.id, mode=status.mode, metric=status.metric, members=members, token=token,
                     recent=node.tally.recent())


def role_name(role: Role, holding: bool) -> str:
    """The role an operator sees: the one played, else "holder" while holding the token, else "idle"."""
    return "holder" if role is Role.IDLE and holding else role.value


def node_status(node: Observed) -> NodeStatus:
    """What ``GET /status`` serves for ``node``."""
    progress, config, tally, role = node.progress, node.config, node.tally, node.roles.role
    local, global_ = node.learner.accuracy  # the task's metric
    task = node.learner.ctx.task
    return NodeStatus(
        id=config.id, swarm=config.swarm, algorithm=config.algorithm, mode=config.schedule.mode,
        model=str(node.learner.ctx.spec), authentication=node.network.authentication,
        insecure=config.network.open_to_network, round=progress.round, role=role_name(role, progress.holding),
        peers=[p.model_copy(update={"link": node.links.report(p.id)}) for p in node.membership.peers()],
        unreachable_peers=node.membership.unreachable(),
        task=task.name, metric=task.metric, local_accuracy=local, global_accuracy=global_,
        privacy=_privacy(node.learner.ctx.privacy),
        **{name: tally.counters[name] for name in COUNTER_FIELDS}, rejected=dict(tally.rejected),
        refused_peers=node.membership.refused(),
        boot_id=node.boot_id, uptime_s=node.clock.wall() - node.started, grpc_address=node.reach.address,
        http_port=config.api.http_port, param_sha256=node.learner.digest, fusing=node.roles.fusing,
        max_concurrent_fusions=node.roles.max_fusing, epoch=progress.epoch, holding=progress.holding,
        done=progress.done and role is Role.IDLE, data=node.data.status(), work_s=node.roles.work_s,
        max_upload=config.network.max_upload, max_download=config.network.max_download,
        reachability=node.reach.state, relay=node.reach.relay or None,
        relaying=RelayView(**asdict(node.network.relay_load()), max_slots=config.network.relay_slots),
    )


def _privacy(privacy: PrivateTraining | None) -> PrivacyView | None:
    """What a node with differential privacy has spent (None: it has none)."""
    if privacy is None:
        return None
    return PrivacyView(epsilon=privacy.epsilon, delta=privacy.delta, budget=privacy.budget,
                       noise_multiplier=privacy.noise, clip=privacy.clip, exhausted=privacy.exhausted)


def rest_url(config: NodeConfig) -> str | None:
    """Where operators reach the node's REST API: ``--status-url``, else its advertised host and HTTP port."""
    api = config.api
    if not api.http_port:
        return None
    if api.status_url:
        return api.status_url.rstrip("/")
    return peer_url({"http_port": api.http_port, "address": config.network.address}, "http://127.0.0.1")
