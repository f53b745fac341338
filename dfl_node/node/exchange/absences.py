"""Peers that leave or restart while this node's group waits for them: an aggregator stops waiting for what can no
longer come, rather than until its deadline (:class:`Absences`, told by the membership).
"""

from __future__ import annotations

import asyncio
import logging

from dfl_node.node.exchange.collector import Collector
from dfl_node.node.exchange.roles import Roles
from dfl_node.node.membership.membership import Members

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits


class Absences:
    def __init__(self, roles: Roles, members: Members) -> None:
        self._roles, self._members = roles, members
        self._releasing: set[asyncio.Task] = set()  # _release_unassigned tasks under way

    def peer_lost(self, peer_id: str) -> None:
        """A peer stopped answering: an aggregator no longer waits for it (it would only wait for its deadline),
        unless its transfer is under way (that stream ends on its own, or after ``stream_timeout``); nor for the
        senders of a holder that is gone (:meth:`_holder_gone`)."""
        collector = self._roles.collector
        if collector is not None and peer_id in collector.missing() and peer_id not in collector.receiving:
            log.info("%s: round %d: sender %s is gone; not waiting for it", self._roles.node_id, collector.round + 1,
                     peer_id)
            collector.withdraw(peer_id)
        self._holder_gone(peer_id, "is gone")

    def peer_joined(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined. One that *restarted* (a new boot id: it crashed and came back, faster than
        ``peer_timeout`` perhaps, so it was never seen to leave) cannot still be sending what its old
        incarnation was assigned: an aggregator stops waiting for it at once, a transfer of it under way
        included, rather than until its deadline (``round_timeout``: a 130 s stall in a storm); nor can it still
        assign the senders it had not yet (:meth:`_holder_gone`)."""
        if not restarted:
            return
        collector = self._roles.collector
        if collector is not None and peer_id in collector.missing():
            log.info("%s: round %d: sender %s restarted; not waiting for it", self._roles.node_id,
                     collector.round + 1, peer_id)
            collector.abandon(peer_id)
        self._holder_gone(peer_id, "restarted")

    def _holder_gone(self, peer_id: str, how: str) -> None:
        """The holder that assigned our aggregator role crashed, perhaps between our Assign and its senders'. An
        aggregator that waited for them until its deadline (``round_timeout``) also kept the lost token from being
        regenerated, as its role counts as the token at work: a 62 s stall in a storm. It stops waiting for the
        senders the holder never assigned (:meth:`_release_unassigned`)."""
        collector = self._roles.collector
        if collector is None or collector.assigned_by != peer_id or collector.gathered.is_set():
            return
        task = asyncio.get_running_loop().create_task(self._release_unassigned(collector, peer_id, how))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_unassigned(self, collector: Collector, holder: str, how: str) -> None:
        """Which of the senders we still wait for did the holder assign before it died? Those that play a role
        now: a sender takes its role on its Assign and keeps it until its transfer is confirmed, and in round
        mode no other role is played meanwhile. So every peer is asked where it stands (a Hello each), and the
        group stops waiting for the senders that play none (:meth:`Collector.release`); the others were told to
        send, will (a sender trains first), and their models are fused as if the holder had lived."""
        await self._members.refresh()
        if self._roles.collector is not collector or collector.gathered.is_set():
            return
        progress = self._members.progress()
        released = collector.release(lambda sender: sender in progress and progress[sender].busy)
        if released:
            log.info("%s: round %d: holder %s %s; not waiting for %s, which it never assigned", self._roles.node_id,
                     collector.round + 1, holder, how, ", ".join(sorted(released)))
