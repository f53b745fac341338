"""Round mode: a token carries round t from node to node; its holder plans the round.

* **Start.** Once it sees ``min_peers`` peers, the node with the lowest id creates the token for
  round 0 (epoch 1) — or for the round its checkpoint says, after a restart.
* **A round.** The holder plans round t with the algorithm's own planner over the live members'
  profiles and the algorithm state the token carries (seed-derived randomness: the same plan as the
  simulator). For each group it assigns the aggregator first (which then expects its senders, or
  pulls from its sources), then the senders, and waits until their transfers are taken, with a
  timeout. An open group (001's client selection) has no aggregator yet: its sender is assigned
  with the candidates, chooses, and assigns the aggregator role itself before it transfers. Fusions, replies and checkpoints run on; each node settles them before its next role.
* **Hand-over.** The holder then announces the token for t+1 — with the plan's algorithm state —
  to every member, naming the next holder (the next id in sorted order).
* **Loss.** If the known holder leaves the peer table (it stopped answering heartbeats) and the
  token has been silent for ``token_timeout``, the lowest live id regenerates it for the last
  announced round with ``epoch + 1``. Every RPC carries the epoch and nodes refuse older ones, so
  a stale holder that comes back is fenced off: two tokens never both make progress.
"""

from __future__ import annotations

import asyncio
import logging
import time

from dfl_node.algorithms import Group, Role
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.node.ports import SchedulerPort

log = logging.getLogger(__name__)


class RoundScheduler:
    def __init__(self, node: SchedulerPort) -> None:
        self.node = node
        self.holder: str | None = None
        self.last_activity = time.monotonic()
        self.finished = asyncio.Event()
        self._holding: asyncio.Task | None = None

    # ----- the watchdog ------------------------------------------------------------------
    def _is_lowest(self) -> bool:
        return all(self.node.node_id < p for p in self.node.peers.alive_ids())

    def _token_lost(self) -> bool:
        holder_alive = self.holder in self.node.peers.alive_ids() or self.holder == self.node.node_id
        silent = time.monotonic() - self.last_activity > self.node.config.token_timeout
        return silent and not holder_alive

    async def run(self) -> None:
        node, state = self.node, self.node.state
        if state.done:
            self.finished.set()
            return
        await node.peers.wait_for(node.config.min_peers)
        self.last_activity = time.monotonic()
        if state.epoch == 0 and self._is_lowest():
            self._start_holding(state.round, 1)
        while not state.done:
            await asyncio.sleep(min(1.0, node.config.token_timeout / 4))
            if not state.holding and self._token_lost() and self._is_lowest():
                log.warning("%s: token of %s lost; regenerating round %d at epoch %d",
                            node.node_id, self.holder, state.round, state.epoch + 1)
                self._start_holding(state.round, state.epoch + 1)

    def _start_holding(self, round_: int, epoch: int) -> None:
        self.node.enter_epoch(epoch)
        self.holder = self.node.node_id
        self.node.set_holding(True)
        self._holding = asyncio.get_running_loop().create_task(self._hold(round_, epoch))

    # ----- the holder --------------------------------------------------------------------
    async def _hold(self, round_: int, epoch: int) -> None:
        node = self.node
        try:
            while True:
                members = sorted(p.node_id for p in node.profiles())
                state = dict(node.state.token_state)
                if node.config.rounds and round_ >= node.config.rounds:
                    await self._announce(pb.RoundToken(round=round_, epoch=epoch, holder=node.node_id,
                                                       seed=node.config.seed, members=members, state=state, done=True))
                    await self.finish(round_)
                    return
                plan = node.algorithm.plan_round(round_, node.profiles(), state)
                await asyncio.gather(*(self._group(g, round_, epoch, dict(plan.state)) for g in plan))
                round_ += 1
                node.set_round(round_, dict(plan.state))
                me = members.index(node.node_id)
                later = members[me + 1 :] + members[:me]
                acks = await self._announce(pb.RoundToken(round=round_, epoch=epoch, holder=later[0],
                                                          seed=node.config.seed, members=members, state=plan.state))
                if any(a is not None and a.reason == "stale_epoch" for a in acks.values()):
                    log.warning("%s: fenced off by a newer epoch; dropping token", node.node_id)
                    return
                if acks.get(later[0]) is not None and acks[later[0]].ok:
                    self.holder = later[0]
                    return
                log.warning("%s: next holder %s unreachable; keeping the token", node.node_id, later[0])
        finally:
            node.set_holding(False)
            self.last_activity = time.monotonic()

    async def _group(self, group: Group, round_: int, epoch: int, state: dict[str, str]) -> None:
        """Assign one group: its aggregator first (so it expects its senders), then the senders (an open
        group's sender assigns the aggregator it chooses)."""
        node = self.node
        address = (node.address_of(group.aggregator) or "") if group.aggregator else ""
        common = dict(round=round_, epoch=epoch, holder=node.node_id, aggregator=group.aggregator,
                      aggregator_address=address, state=state, senders=group.senders, pull=group.pull,
                      deadline_s=node.config.round_timeout, candidates=group.candidates)
        try:
            if not group.open:
                ack = await node.assign_to(group.aggregator, pb.RoundAssignment(role=Role.AGGREGATOR.value, **common))
                if not ack.ok:
                    log.warning("round %d: aggregator %s refused: %s", round_, group.aggregator, ack.reason)
                    return
            if group.pull:
                return
            acks = await asyncio.gather(*(node.assign_to(s, pb.RoundAssignment(role=Role.SENDER.value, **common))
                                          for s in group.senders))
        except Exception:  # a bug in one group must not kill the token: log it and let the round end
            log.exception("round %d: the group of %s crashed", round_, group.aggregator)
            return
        for sender, ack in zip(group.senders, acks):
            if not ack.ok:
                log.warning("round %d: %s → %s did not complete: %s", round_, sender,
                            group.aggregator or "/".join(group.candidates), ack.reason)

    async def _announce(self, token: pb.RoundToken) -> dict[str, pb.Ack | None]:
        """Send the token to every other member; returns each member's ack (None: unreachable)."""
        others = [m for m in token.members if m != self.node.node_id]
        acks = await asyncio.gather(*(self.node.pass_token(m, token) for m in others))
        return dict(zip(others, acks))

    async def finish(self, round_: int) -> None:
        await self.node.finish(round_)
        self.finished.set()

    def on_join(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined. If it restarted while holding the token, the token died with it; if the
        fleet already finished, tell it so: it missed the final announcement."""
        node, state = self.node, self.node.state
        if restarted and peer_id == self.holder:
            log.warning("%s: holder %s restarted; its token is lost", node.node_id, peer_id)
            self.holder = None  # the watchdog regenerates it (epoch + 1) after token_timeout of silence
        if not state.done:
            return  # it learns the round from the next announcement
        token = pb.RoundToken(round=state.round, epoch=state.epoch, holder=node.node_id, seed=node.config.seed,
                              members=[peer_id], state=state.token_state, done=True)
        asyncio.get_running_loop().create_task(self._announce(token))

    # ----- RPCs --------------------------------------------------------------------------
    def _fresh(self, epoch: int) -> bool:
        if not self.node.enter_epoch(epoch):
            return False
        self.last_activity = time.monotonic()
        return True

    async def assign(self, request: pb.RoundAssignment) -> pb.Ack:
        if not self._fresh(request.epoch):
            return pb.Ack(ok=False, reason="stale_epoch")
        self.holder = request.holder
        ack = await self.node.play(request)
        self.last_activity = time.monotonic()
        return ack

    async def token(self, request: pb.RoundToken) -> pb.Ack:
        node = self.node
        if request.seed != node.config.seed:
            return pb.Ack(ok=False, reason="seed_mismatch")
        if not self._fresh(request.epoch):
            return pb.Ack(ok=False, reason="stale_epoch")
        self.holder = request.holder
        node.set_round(request.round, dict(request.state))
        if request.done:
            if not node.state.done:
                asyncio.get_running_loop().create_task(self.finish(request.round))
        elif request.holder == node.node_id and not node.state.holding:
            self._start_holding(request.round, request.epoch)
        return pb.Ack(ok=True)
