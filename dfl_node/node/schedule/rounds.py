"""Round mode: a token carries round t from node to node; its holder plans the round.

* **Start.** Once it sees ``min_peers`` peers, the node with the lowest id creates the token for
  round 0 (epoch 1) — or for the round its checkpoint says, after a restart — unless a peer already
  saw a token (a node restarted before it checkpointed any epoch must not start a second token).
* **A round.** The holder plans round t with the algorithm's own planner over the live members'
  profiles and the algorithm state the token carries (seed-derived randomness: the same plan as the
  simulator). For each group it assigns the aggregator first (which then expects its senders, or
  pulls from its sources), then the senders. A group is done when its fusion is durable: a sender's
  Ack comes only once its aggregator confirmed a checkpointed fusion. An open group (001's client
  selection) has no aggregator yet: its sender is assigned with the candidates, chooses, and assigns
  the aggregator role itself before it transfers.
* **Exactly once.** A round whose groups did not all fuse is played again: after a heartbeat the
  holder re-plans it from the live members (a crashed member that restarts is assigned again: the
  Assign waits for it, up to ``round_timeout``). A node that already played round t (its checkpoint
  says so) answers ``already_played`` and the holder counts its group as done, so no node fuses a
  round twice, even when its confirmation was lost with a crash. Replays are for crashes only: a group
  whose members stay alive and unrestarted and still refuse for ``round_timeout`` is abandoned
  (counted ``groups_abandoned``), so one member that will not play cannot stop the fleet.
* **Hand-over.** The holder then passes the token for t+1 — with the plan's algorithm state — to
  the next holder (the next id in sorted order), and only then, holding nothing any more, announces
  it to the other members: an announcement that waits on a crashed member must not keep a node
  holding while the token comes round to it again (it would ignore the token and the fleet stall).
* **Loss.** Every HelloReply carries the replier's :class:`~dfl_node.peering.messages.Progress` (round, epoch,
  whether it
  holds the token or plays a role). When no live node has held the token nor sent an RPC of it for
  ``token_timeout``, the lowest *live* id — re-evaluated at every tick, as the peer table changes —
  waits (up to ``round_timeout`` more) until every known member answers again, as a crashed one may be
  the only node that knows the newest round, then asks every peer afresh and, if still nobody holds the
  token or is playing a role, regenerates it
  at ``epoch + 1`` (over the newest epoch anyone saw) for the highest round any live node completed,
  with that node's algorithm state. Every RPC carries the epoch and nodes refuse older ones; a
  holder that sees a newer epoch drops its token, so a stale holder that comes back is fenced off.
* **Liveness.** How long the fleet may go without fusing after a member's crash, and why:
  :mod:`.liveness`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence

from dfl_node.algorithms import Group, Role, RoundPlan, Step
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.schedule.ports import SchedulerPort
from dfl_node.peering.errors import PeerUnreachable
from dfl_node.peering.messages import Ack, Progress, Token

log = logging.getLogger(__name__)
DEADLINE_FACTOR = 3.0  # a group's deadline, in multiples of the computation its members' last roles took


class RoundScheduler:
    def __init__(self, node: SchedulerPort) -> None:
        self.node = node
        self.last_activity = 0.0  # when a token was last seen at work (an RPC of it, a holder), on the node's clock
        self.finished = asyncio.Event()
        self._holding: asyncio.Task | None = None
        self._holding_epoch = 0

    # ----- the watchdog ------------------------------------------------------------------
    def _is_lowest(self) -> bool:
        return all(self.node.node_id < p for p in self.node.members.alive_ids())

    def _token_at_work(self, progress: dict[str, Progress]) -> bool:
        """Whether a token of our epoch (or newer) is held somewhere, or a role that may complete a round is
        still being played."""
        ours = self.node.progress
        return ours.holding or any(p.busy or (p.holding and p.epoch >= ours.epoch) for p in progress.values())

    async def run(self) -> None:
        node, ours = self.node, self.node.progress
        if ours.done:
            self.finished.set()
            return
        await node.members.wait_for(node.settings.min_peers)
        self.last_activity = node.clock.monotonic()
        progress = node.members.progress()
        if ours.epoch == 0 and self._is_lowest() and all(p.epoch == 0 for p in progress.values()):
            self._start_holding(ours.round, 1)
        while not ours.done:
            await asyncio.sleep(min(1.0, node.settings.token_timeout / 4))
            await self._watch()

    async def _watch(self) -> None:
        """One tick of the watchdog: finish if a peer says the fleet is done; regenerate a lost token."""
        node, ours, settings = self.node, self.node.progress, self.node.settings
        progress = node.members.progress()
        done = [p.round for p in progress.values() if p.done]
        if done:  # we missed the final announcement (we were down, or it did not reach us)
            await self.finish(max(done))
            return
        if self._token_at_work(progress):
            self.last_activity = node.clock.monotonic()
            return
        silent = node.clock.monotonic() - self.last_activity
        if silent <= settings.token_timeout or not self._is_lowest():
            return
        if node.members.dead_ids() and silent <= settings.token_timeout + settings.round_timeout:
            return  # a member that crashed may be the only one that knows the newest round: give it time to return
        await node.members.refresh()  # decide on what the peers say now, not a heartbeat ago
        progress = node.members.progress()
        if ours.done or self._token_at_work(progress) or not self._is_lowest():
            return
        round_, token_state = ours.round, ours.token_state
        for peer in progress.values():
            if peer.round > round_:
                round_, token_state = peer.round, dict(peer.state)
        epoch = max([ours.epoch, *(p.epoch for p in progress.values())]) + 1
        log.warning("%s: the token is lost; regenerating round %d at epoch %d", node.node_id, round_ + 1, epoch)
        ours.advance(round_, token_state)
        self._start_holding(round_, epoch)

    def _start_holding(self, round_: int, epoch: int, members: Sequence[str] = ()) -> None:
        self.node.progress.enter_epoch(epoch)
        self.node.progress.set_holding(True)
        self._holding_epoch = epoch
        self._holding = asyncio.get_running_loop().create_task(self._hold(round_, epoch, members))

    # ----- the holder --------------------------------------------------------------------
    async def _hold(self, round_: int, epoch: int, members: Sequence[str]) -> None:
        """Play rounds from ``round_`` and hand the token on. ``members`` are the fleet as the previous holder
        saw it: we plan only once we see them too (or ``peer_timeout`` passed and the missing ones count as
        gone) — a new holder that has not yet heard from a member would otherwise plan a different round."""
        node = self.node
        try:
            await node.members.wait_alive(members, node.membership.peer_timeout)
            while node.progress.epoch == epoch:
                members = sorted(p.node_id for p in node.members.profiles())
                state = node.progress.token_state
                if node.settings.rounds and round_ >= node.settings.rounds:
                    await self._announce(Token(round=round_, epoch=epoch, holder=node.node_id, seed=node.seed,
                                               members=tuple(members), state=state, done=True))
                    await self.finish(round_)
                    return
                next_state = await self._play_round(round_, epoch, state)
                if next_state is None:
                    log.warning("%s: fenced off by a newer epoch; dropping token", node.node_id)
                    return
                node.tally.count("rounds_held")
                round_ += 1
                node.progress.advance(round_, next_state)
                members = sorted(p.node_id for p in node.members.profiles())
                me = members.index(node.node_id)
                later = members[me + 1 :] + members[:me]
                token = Token(round=round_, epoch=epoch, holder=later[0], seed=node.seed,
                              members=tuple(members), state=next_state)
                ack = await self._pass(later[0], token)
                if ack is not None and ack.reason == "stale_epoch":
                    log.warning("%s: fenced off by a newer epoch; dropping token", node.node_id)
                    return
                if ack is not None and ack.ok:
                    # Handed over: we hold nothing from here, even while the others hear of the round (a crashed
                    # member can keep that waiting for seconds), so the token can come back to us meanwhile.
                    self._release()
                    await self._announce(token, skip=later[0])
                    return
                log.warning("%s: next holder %s unreachable; keeping the token", node.node_id, later[0])
        finally:
            self._release()
            self.last_activity = node.clock.monotonic()

    def _release(self) -> None:
        """The calling hold ends: this node holds no token any more, unless a later hold already started."""
        if self._holding is asyncio.current_task():
            self._holding = None
            self.node.progress.set_holding(False)

    async def _play_round(self, round_: int, epoch: int, state: dict[str, str]) -> dict[str, str] | None:
        """Play round ``round_`` until every group of its plan fused (see "Exactly once"); returns the
        algorithm state for the next round, or None if a newer epoch fenced this token off meanwhile.

        Replays are for crashes. A group whose members all live on and that failed ``group_attempts`` times (a link
        that cannot carry its model, a device too slow for its deadline) is planned around: the round is planned
        again over the members that neither played it nor sent or aggregated in such a group, and those play it
        (:meth:`_around`). A group whose members all stayed alive, without restarting, and still did not fuse for a
        whole ``round_timeout`` is refusing, not crashing (a member that will not take its role): it is abandoned,
        logged and counted (``groups_abandoned``), and the round goes on without it.
        """
        node = self.node
        plan = node.algorithm.plan_round(round_, node.members.profiles(), state)
        pending, failed_since = list(plan), None
        failures: Counter[Group] = Counter()
        told: set[Group] = set()  # groups whose fusion may have begun: a sender was dispatched (a pull: its aggregator)
        played: set[str] = set()  # members of the groups that fused: they played this round
        around: set[str] = set()  # members of the groups planned around
        calm_since, seen = node.clock.monotonic(), None  # since when the failing groups' members all lived on unchanged
        while node.progress.epoch == epoch:
            done = await asyncio.gather(*(self._group(g, round_, epoch, dict(plan.state), told) for g in pending))
            played.update(m for g, ok in zip(pending, done) if ok for m in g.members)
            pending = [g for g, ok in zip(pending, done) if not ok]
            if not pending:
                return dict(plan.state)
            log.warning("%s: round %d: %d group(s) did not fuse; playing them again", node.node_id, round_ + 1,
                        len(pending))
            failures.update(pending)
            failed_since = failed_since or node.clock.monotonic()
            await asyncio.sleep(node.membership.heartbeat)  # the membership sees who crashed (or came back)
            maybe = await self._unfused([g for g in pending if g in told], round_, failed_since)
            pending = [g for g in pending if g not in told or g in maybe]  # no sender told: it cannot have fused
            if any(m not in node.members.alive_ids() and m != node.node_id for g in pending for m in g.members):
                plan = node.algorithm.plan_round(round_, node.members.profiles(), state)  # a member is gone: re-plan
                pending = list(plan)
            stuck = [g for g in pending if failures[g] >= node.settings.group_attempts]
            if stuck:  # its senders and aggregator (an open group's candidates, never bound, may play again)
                around.update(m for g in stuck for m in (g.aggregator, *g.senders) if m)
                replanned = self._around(round_, state, stuck, played | around)
                if replanned is None:
                    return dict(plan.state)
                plan, pending = replanned, list(replanned)
            now = self._incarnations(pending)
            if now != seen or None in now.values():
                seen, calm_since = now, node.clock.monotonic()  # a crash, a restart or a new plan: replays go on
            elif pending and node.clock.monotonic() - calm_since >= node.settings.round_timeout:
                log.warning("%s: round %d: abandoning %d group(s) (%s): their members are alive and refuse",
                            node.node_id, round_ + 1, len(pending), ", ".join("/".join(g.members) for g in pending))
                node.tally.count("groups_abandoned", len(pending))
                return dict(plan.state)
        return None

    def _around(self, round_: int, state: dict[str, str], stuck: list[Group], left_out: set[str]) -> RoundPlan | None:
        """Round ``round_`` planned again without ``left_out`` (those that played it, and the senders and aggregators
        of the groups that kept failing, ``stuck``): the round's exchange happens between members that can make it,
        as the plan of a fleet without them would have it. None where too few are left for a plan: the round is
        over with the groups that fused."""
        node = self.node
        for group in stuck:
            who = " → ".join(["/".join(group.senders or group.candidates), group.aggregator or "?"])
            log.warning("%s: round %d: planning around %s: the group failed %d times with its members alive (a link "
                        "that cannot carry its model, or a member too slow for its deadline)", node.node_id,
                        round_ + 1, who, node.settings.group_attempts)
            node.tally.event("replan", "/".join(group.members)[:64], f"failed {node.settings.group_attempts} times",
                             round_ + 1)
        node.tally.count("groups_replanned", len(stuck))
        try:
            return node.algorithm.plan_round(
                round_, [p for p in node.members.profiles() if p.node_id not in left_out], state)
        except ValueError as exc:  # fewer members left than a plan needs
            log.warning("%s: round %d: no plan without them (%s); the round ends with the groups that fused",
                        node.node_id, round_ + 1, exc)
            return None

    def _incarnations(self, groups: list[Group]) -> dict[str, str | None]:
        """The other members' boot ids (None: not alive)."""
        others = sorted({m for g in groups for m in g.members} - {self.node.node_id})
        return self.node.members.incarnations(others)

    async def _unfused(self, groups: list[Group], round_: int, failed_since: float) -> list[Group]:
        """The groups whose aggregator did not fuse ``round_`` after all. A sender's confirmation can be lost
        after its aggregator fused (the sender crashed), so each aggregator is asked, by its progress, once
        it answers and plays no role any more — waited for up to ``round_timeout`` since the round failed. An
        aggregator still busy while none of its senders is (each gave its role up: none can still deliver) is not
        waited for: played again, it is assigned again, and either gives up its wait (it holds nothing) or, fusing
        what arrived, answers that it played the round."""
        node = self.node
        deadline = failed_since + node.settings.round_timeout

        def waited_for(group: Group, progress: Progress) -> bool:
            return progress.busy and any((p := self._progress_of(s)) is not None and p.busy for s in group.senders)

        while groups:
            await node.members.refresh()
            known = {g.aggregator: self._progress_of(g.aggregator) for g in groups if g.aggregator}
            answered = all((p := known.get(g.aggregator)) is not None and not waited_for(g, p)
                           for g in groups if g.aggregator)
            if answered or node.clock.monotonic() > deadline:
                return [g for g in groups if (p := known.get(g.aggregator)) is None or p.round <= round_]
            await asyncio.sleep(node.membership.heartbeat)
        return []

    def _progress_of(self, node_id: str) -> Progress | None:
        """Where ``node_id`` stands (None: it does not answer)."""
        node = self.node
        return node.own_progress() if node_id == node.node_id else node.members.progress().get(node_id)

    async def _group(self, group: Group, round_: int, epoch: int, state: dict[str, str], told: set[Group]) -> bool:
        """Give one group its roles: its aggregator first (so it expects its senders), then the senders (an open
        group's sender gives the aggregator it chooses its role). Returns whether the group's fusion is durable; the
        group joins ``told`` once a role that can fuse it went out (a sender's, or a pulling aggregator's)."""
        node = self.node
        addresses = {m: a for m in group.members if (a := node.members.address_of(m)) is not None}
        deadline = self._deadline(group)

        def order(role: Role) -> Assignment:
            return Assignment(role, Step(round_, group, dict(state)), epoch, node.node_id,
                         addresses.get(group.aggregator, ""), deadline, addresses)

        try:
            if group.pull:
                told.add(group)
            if not group.open:
                ack = await node.roles.dispatch(group.aggregator, order(Role.AGGREGATOR))
                if ack.ok and (group.pull or ack.reason == "already_played"):
                    return True  # a pulling aggregator acks once it fused
                if not ack.ok:
                    log.warning("round %d: aggregator %s refused: %s", round_ + 1, group.aggregator, ack.reason)
                    return False
            told.add(group)
            acks = await asyncio.gather(*(node.roles.dispatch(s, order(Role.SENDER)) for s in group.senders))
        except Exception:  # a bug in one group must not kill the token: log it and play the round again
            log.exception("round %d: the group of %s crashed", round_ + 1, group.aggregator)
            return False
        for sender, ack in zip(group.senders, acks):
            if not ack.ok:
                log.warning("round %d: %s → %s did not complete: %s", round_ + 1, sender,
                            group.aggregator or "/".join(group.candidates), ack.reason)
        return any(ack.ok for ack in acks)

    def _deadline(self, group: Group) -> float:
        """How long the roles of ``group`` may take: :data:`DEADLINE_FACTOR` times the computation its slowest
        sender's last role took, then its (slowest candidate) aggregator's — their profiles, as their Hellos say them
        — within ``[round_timeout, max_round_timeout]``. So a slow device's training is waited for rather than
        thrown away, and a fast fleet's deadline stays ``round_timeout``."""
        node, settings = self.node, self.node.settings

        def work(ids: tuple[str, ...]) -> float:
            return max((node.roles.work_s if m == node.node_id else node.members.work_of(m) for m in ids), default=0.0)

        expected = work(group.senders) + work((group.aggregator,) if group.aggregator else group.candidates)
        return min(settings.max_round_timeout, max(settings.round_timeout, DEADLINE_FACTOR * expected))

    async def _announce(self, token: Token, skip: str = "") -> dict[str, Ack | None]:
        """Send the token to every other member (but ``skip``); returns each one's ack (None: unreachable)."""
        others = [m for m in token.members if m not in (self.node.node_id, skip)]
        acks = await asyncio.gather(*(self._pass(m, token) for m in others))
        return dict(zip(others, acks))

    async def _pass(self, node_id: str, token: Token) -> Ack | None:
        """The token (or its announcement) to ``node_id``; None: unreachable."""
        address = self.node.members.address_of(node_id)
        if address is None:
            return None
        try:
            return await self.node.network.link(address).pass_token(token, timeout=5.0)
        except PeerUnreachable:
            return None

    async def finish(self, round_: int) -> None:
        await self.node.finish(round_)
        self.finished.set()

    def on_join(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined. If the fleet already finished, tell it so: it missed the final announcement.
        (A holder that restarted lost its token: the watchdog sees that nobody holds it any more.)"""
        node, ours = self.node, self.node.progress
        if not ours.done:
            return  # it learns the round from the next announcement
        token = Token(round=ours.round, epoch=ours.epoch, holder=node.node_id, seed=node.seed,
                      members=(peer_id,), state=ours.token_state, done=True)
        asyncio.get_running_loop().create_task(self._announce(token))

    # ----- RPCs --------------------------------------------------------------------------
    def _fresh(self, epoch: int) -> bool:
        """Fencing: False for an older epoch. A newer one ends our own holding: that token is stale."""
        if not self.node.progress.enter_epoch(epoch):
            return False
        if self._holding is not None and epoch > self._holding_epoch:
            log.warning("%s: a token of epoch %d supersedes ours (%d); dropping it", self.node.node_id, epoch,
                        self._holding_epoch)
            self._holding.cancel()
            self._holding = None
            self.node.progress.set_holding(False)
        self.last_activity = self.node.clock.monotonic()
        return True

    async def play(self, order: Assignment) -> Ack:
        """A role from a holder: fenced by its epoch, then played."""
        if not self._fresh(order.epoch):
            return Ack(ok=False, reason="stale_epoch")
        ack = await self.node.roles.play(order)
        self.last_activity = self.node.clock.monotonic()
        return ack

    async def token(self, request: Token) -> Ack:
        node = self.node
        if request.seed != node.seed:
            return Ack(ok=False, reason="seed_mismatch")
        if not self._fresh(request.epoch):
            return Ack(ok=False, reason="stale_epoch")
        node.progress.advance(request.round, request.state)
        if request.done:
            if not node.progress.done:
                asyncio.get_running_loop().create_task(self.finish(request.round))
        elif request.holder == node.node_id and not node.progress.holding:
            self._start_holding(request.round, request.epoch, request.members)
        return Ack(ok=True)
