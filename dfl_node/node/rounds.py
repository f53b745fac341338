"""Round mode: a token carries round t from node to node; its holder plans the round.

* **Start.** Once it sees ``min_peers`` peers, the node with the lowest id creates the token for
  round 0 (epoch 1) — or for the round its checkpoint says, after a restart.
* **A round.** The holder plans round t with the algorithm's own planner over the live members
  (sorted ids, seed-derived randomness: the same plan as the simulator), tells each sender its
  receiver (``Assign``, answered when the pairing is done) and waits for them, with a timeout.
* **Hand-over.** The holder then announces the token for t+1 to every member, naming the next
  holder (the next id in sorted order); every node learns the round, the epoch and the holder.
* **Loss.** If the known holder leaves the peer table (it stopped answering heartbeats) and the
  token has been silent for ``token_timeout``, the lowest live id regenerates it for the last
  announced round with ``epoch + 1``. Every RPC carries the epoch and nodes refuse older ones, so
  a stale holder that comes back is fenced off: two tokens never both make progress.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from dfl_node.algorithms import Pairing
from dfl_node.net.codec import TransferRejected
from dfl_node.net.proto import dfl_pb2 as pb

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)


class RoundScheduler:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.holder: str | None = None
        self.last_activity = time.monotonic()
        self.finished = asyncio.Event()
        self._holding: asyncio.Task | None = None

    # ----- the watchdog ------------------------------------------------------------------
    def _is_lowest(self) -> bool:
        return all(self.node.config.id < p for p in self.node.peers.alive_ids())

    def _token_lost(self) -> bool:
        holder_alive = self.holder in self.node.peers.alive_ids() or self.holder == self.node.config.id
        silent = time.monotonic() - self.last_activity > self.node.config.token_timeout
        return silent and not holder_alive

    async def run(self) -> None:
        node = self.node
        if node.done:
            self.finished.set()
            return
        await node.peers.wait_for(node.config.min_peers)
        self.last_activity = time.monotonic()
        if node.epoch == 0 and self._is_lowest():
            self._start_holding(node.round, 1)
        while not node.done:
            await asyncio.sleep(min(1.0, node.config.token_timeout / 4))
            if not node.holding and self._token_lost() and self._is_lowest():
                log.warning("%s: token of %s lost; regenerating round %d at epoch %d",
                            node.config.id, self.holder, node.round, node.epoch + 1)
                self._start_holding(node.round, node.epoch + 1)

    def _start_holding(self, round_: int, epoch: int) -> None:
        self.node.epoch = epoch
        self.holder = self.node.config.id
        self.node.holding = True
        self._holding = asyncio.get_running_loop().create_task(self._hold(round_, epoch))

    # ----- the holder --------------------------------------------------------------------
    async def _hold(self, round_: int, epoch: int) -> None:
        node = self.node
        try:
            while True:
                members = sorted([*node.peers.alive_ids(), node.config.id])
                if node.config.rounds and round_ >= node.config.rounds:
                    await self._announce(pb.RoundToken(round=round_, epoch=epoch, holder=node.config.id,
                                                       seed=node.config.seed, members=members, state={"done": "1"}))
                    await self.finish(round_)
                    return
                plan = node.algorithm.plan_round(round_, members)
                await asyncio.gather(*(self._pairing(p, round_, epoch) for p in plan.pairings))
                round_ += 1
                node.round = round_
                later = members[members.index(node.config.id) + 1:] + members[: members.index(node.config.id)]
                acks = await self._announce(pb.RoundToken(round=round_, epoch=epoch, holder=later[0],
                                                          seed=node.config.seed, members=members))
                if any(a is not None and a.reason == "stale_epoch" for a in acks.values()):
                    log.warning("%s: fenced off by a newer epoch; dropping token", node.config.id)
                    return
                if acks.get(later[0]) is not None and acks[later[0]].ok:
                    self.holder = later[0]
                    return
                log.warning("%s: next holder %s unreachable; keeping the token", node.config.id, later[0])
        finally:
            node.holding = False
            self.last_activity = time.monotonic()

    async def _pairing(self, pairing: Pairing, round_: int, epoch: int) -> None:
        node = self.node
        receiver = node.peers.address_of(pairing.receiver) or node.grpc_address
        try:
            if pairing.sender == node.config.id:
                ok = await node.send(round_, epoch, [(pairing.receiver, receiver)]) is not None
            else:
                sender = node.peers.address_of(pairing.sender)
                ack = await node.client(sender).assign(
                    pb.RoundAssignment(round=round_, epoch=epoch, holder=node.config.id, role="sender",
                                       peer_id=pairing.receiver, peer_address=receiver),
                    timeout=node.config.round_timeout)
                ok = ack.ok
        except (grpc.aio.AioRpcError, TransferRejected) as exc:
            ok = False
            log.warning("round %d: %s → %s failed: %s", round_, pairing.sender, pairing.receiver, exc)
        except Exception:  # a bug in one pairing must not kill the token: log it and let the round end
            ok = False
            log.exception("round %d: %s → %s crashed", round_, pairing.sender, pairing.receiver)
        if not ok:
            log.warning("round %d: pairing %s → %s did not complete", round_, pairing.sender, pairing.receiver)

    async def _announce(self, token: pb.RoundToken) -> dict[str, pb.Ack | None]:
        """Send the token to every other member; returns each member's ack (None: unreachable)."""
        node = self.node

        async def one(peer_id: str) -> pb.Ack | None:
            try:
                return await node.client(node.peers.address_of(peer_id)).pass_token(token, timeout=5.0)
            except grpc.aio.AioRpcError:
                return None

        others = [m for m in token.members if m != node.config.id]
        return dict(zip(others, await asyncio.gather(*(one(m) for m in others))))

    async def finish(self, round_: int) -> None:
        node = self.node
        await node.settled()  # the last round's receiver may still be fusing: its model is the final one
        node.round, node.done = round_, True
        if node.config.evaluate and node.accuracy == (None, None):
            node.accuracy = await asyncio.to_thread(node._evaluate)
        await node.save()
        log.info("%s: done after %d rounds", node.config.id, round_)
        self.finished.set()

    def on_join(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined. If it restarted while holding the token, the token died with it; if the
        fleet already finished, tell it so: it missed the final announcement."""
        node = self.node
        if restarted and peer_id == self.holder:
            log.warning("%s: holder %s restarted; its token is lost", node.config.id, peer_id)
            self.holder = None  # the watchdog regenerates it (epoch + 1) after token_timeout of silence
        if not node.done:
            return  # it learns the round from the next announcement
        token = pb.RoundToken(round=node.round, epoch=node.epoch, holder=node.config.id, seed=node.config.seed,
                              members=[peer_id], state={"done": "1"})
        asyncio.get_running_loop().create_task(self._announce(token))

    # ----- RPCs --------------------------------------------------------------------------
    def _fresh(self, epoch: int) -> bool:
        if epoch < self.node.epoch:
            return False
        self.node.epoch = epoch
        self.last_activity = time.monotonic()
        return True

    async def assign(self, request: pb.RoundAssignment) -> pb.Ack:
        if not self._fresh(request.epoch):
            return pb.Ack(ok=False, reason="stale_epoch")
        self.holder = request.holder
        try:
            target = await self.node.send(request.round, request.epoch, [(request.peer_id, request.peer_address)])
        except TransferRejected as exc:
            return pb.Ack(ok=False, reason=exc.reason)
        self.last_activity = time.monotonic()
        return pb.Ack(ok=target is not None, reason="" if target else "transfer_failed")

    async def token(self, request: pb.RoundToken) -> pb.Ack:
        node = self.node
        if request.seed != node.config.seed:
            return pb.Ack(ok=False, reason="seed_mismatch")
        if not self._fresh(request.epoch):
            return pb.Ack(ok=False, reason="stale_epoch")
        self.holder = request.holder
        node.round = request.round
        if request.state.get("done"):
            if not node.done:
                asyncio.get_running_loop().create_task(self.finish(request.round))
        elif request.holder == node.config.id and not node.holding:
            self._start_holding(request.round, request.epoch)
        return pb.Ack(ok=True)
