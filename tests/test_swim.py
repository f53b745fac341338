"""The membership by SWIM: its rules one by one on a lone node (:class:`~dfl_node.node.membership.swim.Swim`), its
gossip queue's bounds, the Ping over gRPC's conversion, and whole simulated fleets of the daemon's own nodes: a load
per node that does not grow with the fleet, no false suspicion, a kill known everywhere within the stated bound,
every start known everywhere in a few periods."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dfl_node.algorithms.plan import NodeProfile
from dfl_node.net.convert import from_wire, to_wire
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.membership.events import NoEvents
from dfl_node.node.membership.membership import Membership
from dfl_node.node.membership.peers import PeerTable
from dfl_node.node.membership.piggyback import PiggybackQueue
from dfl_node.node.membership.swim import Swim
from dfl_node.node.membership.swim_bounds import detection_bound, join_bound
from dfl_node.node.membership.swim_member import ALIVE, DEAD, SUSPECT
from dfl_node.peering.errors import PeerUnreachable
from dfl_node.peering.messages import MAX_ID, Hello, HelloReply, MemberUpdate, Ping, PingAck, Progress
from dfl_node.records.metrics import NodeMetrics
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import MembershipSettings
from dfl_node.settings.simulation import FaultSchedule, KillFault, SimulationSettings
from dfl_node.sim.clock import run_virtual
from dfl_node.sim.experiment import run_fleet
from dfl_node.sim.traffic import message_size
from tests.membership_fleet import FINGERPRINT, MODEL, SAMPLES, Kill, member_hello, run_members

IDLE = ExperimentConfig(nodes=10, partition="iid", seed=3, batch_size=20, mkt_batch_size=20, hidden=[16])


def hello(node_id: str, round_: int = 0) -> Hello:
    return Hello(node_id=node_id, grpc_address=f"{node_id}:1", boot_id=node_id, progress=Progress(round=round_))


class _Network:
    """No peer is ever dialled in the rule tests: each feeds :meth:`Swim.merge` directly."""

    def heard(self, address: str, node_id: str) -> None:
        pass


class _SwimSees(NoEvents):
    """The table's Hellos go into SWIM's view, as a node's membership has them (its other events are dropped)."""

    def __init__(self, swim: Swim) -> None:
        self.swim = swim

    def seen(self, hello: Hello) -> None:
        self.swim.seen(hello)


def lone(run: Any) -> Any:
    """``run(swim)`` (awaited if a coroutine) on a loop, for node "a" whose own Hello says round 0 (no peer ever
    answers)."""
    async def main() -> Any:
        clock = Clock()
        table = PeerTable("a", hello=None, clock=clock, heartbeat=1.0, timeout=4.0, static=[])  # type: ignore[arg-type]
        swim = Swim("a", MembershipSettings(), clock, table=table, network=_Network(),  # type: ignore[arg-type]
                    hello=lambda: hello("a"), compatible=lambda peer: True, seed=1)
        table.events = _SwimSees(swim)
        result = run(swim)
        return await result if asyncio.iscoroutine(result) else result
    return run_virtual(main())


def test_a_suspicion_of_ourselves_is_refuted_with_a_higher_incarnation() -> None:
    def run(swim: Swim) -> tuple[int, int, MemberUpdate]:
        before = swim.own().incarnation
        swim.merge([MemberUpdate(state=SUSPECT, incarnation=before, node_id="a", sender="b")])
        return before, swim.incarnation, swim.gossip.take(10)[0]

    before, after, gossiped = lone(run)
    assert after == before + 1
    assert gossiped.node_id == "a" and gossiped.state == ALIVE and gossiped.incarnation == after


def test_news_is_ordered_by_incarnation_and_worse_news_wins_at_one() -> None:
    def run(swim: Swim) -> list[str]:
        states = []
        swim.merge([MemberUpdate(state=ALIVE, incarnation=5, node_id="b", hello=hello("b"))])
        states.append(swim.members["b"].state)
        swim.merge([MemberUpdate(state=SUSPECT, incarnation=4, node_id="b", sender="c")])  # older: ignored
        states.append(swim.members["b"].state)
        swim.merge([MemberUpdate(state=SUSPECT, incarnation=5, node_id="b", sender="c")])
        states.append(swim.members["b"].state)
        swim.merge([MemberUpdate(state=ALIVE, incarnation=5, node_id="b", hello=hello("b"))])  # no refutation
        states.append(swim.members["b"].state)
        swim.merge([MemberUpdate(state=ALIVE, incarnation=6, node_id="b", hello=hello("b", 3))])  # refuted
        states.append(swim.members["b"].state)
        swim.merge([MemberUpdate(state=DEAD, incarnation=6, node_id="b", sender="c")])
        states.append(swim.members["b"].state)
        states.append(",".join(swim.table.alive_ids()))
        return states

    assert lone(run) == [ALIVE, ALIVE, SUSPECT, SUSPECT, ALIVE, DEAD, ""]


def test_a_push_pull_answers_with_what_the_asker_lacks_or_holds_older() -> None:
    """The asker's view merged, the answer carries us and each member the asker did not say as we hold it: one it
    lacks, one it holds at an older incarnation, one it holds alive that we know suspect — not one it said as we
    hold it, nor the asker itself."""
    async def run(swim: Swim) -> tuple[list[tuple[str, str, int]], str]:
        swim.merge([MemberUpdate(state=ALIVE, incarnation=1, node_id=i, hello=hello(i)) for i in "bcde"])
        swim.merge([MemberUpdate(state=SUSPECT, incarnation=1, node_id="e", sender="b")])
        asker = [MemberUpdate(state=ALIVE, incarnation=4, node_id="x", hello=hello("x")),
                 MemberUpdate(state=ALIVE, incarnation=1, node_id="b", sender="x", hello=hello("b")),
                 MemberUpdate(state=ALIVE, incarnation=0, node_id="c", sender="x", hello=hello("c")),
                 MemberUpdate(state=ALIVE, incarnation=1, node_id="e", sender="x", hello=hello("e"))]
        ack = await swim.answer(Ping(sender="x", sync=True, updates=tuple(asker)))
        return [(u.node_id, u.state, u.incarnation) for u in ack.updates[1:]], ack.updates[0].node_id

    answered, first = lone(run)
    assert first == "a" and answered == [("c", ALIVE, 1), ("d", ALIVE, 1), ("e", SUSPECT, 1)]


@pytest.mark.parametrize(("static", "greeted"), [(0, ["b"]), (32, ["b"]), (33, [])])
def test_a_fleet_listed_as_more_than_32_static_peers_confirms_lazily_from_the_start(static: int,
                                                                                     greeted: list[str]) -> None:
    """A member learned is greeted at once only in a small fleet: one whose members known, and static peers
    listed, are 32 at most (a thousand nodes listing each other know few members in their first periods)."""
    async def main() -> list[str]:
        calls: list[str] = []

        async def greet(node_id: str, address: str, timeout: float) -> bool:
            calls.append(node_id)
            return True

        clock = Clock()
        table = PeerTable("a", hello=None, clock=clock, heartbeat=1.0, timeout=4.0,  # type: ignore[arg-type]
                          static=[f"10.0.0.{i}:1" for i in range(static)])
        swim = Swim("a", MembershipSettings(), clock, table=table, network=_Network(),  # type: ignore[arg-type]
                    hello=lambda: hello("a"), compatible=lambda peer: True, seed=1,
                    confirmed=lambda peer: False, greet=greet)
        swim.merge([MemberUpdate(state=ALIVE, incarnation=1, node_id="b", hello=hello("b"))])
        await asyncio.sleep(0)
        return calls

    assert run_virtual(main()) == greeted


def test_gossip_carries_progress_into_the_table() -> None:
    def run(swim: Swim) -> int | None:
        swim.merge([MemberUpdate(state=ALIVE, incarnation=1, node_id="b", hello=hello("b", 7))])
        progress = swim.table.progress().get("b")
        return progress.round if progress else None

    assert lone(run) == 7


def test_malformed_updates_are_dropped_and_counted() -> None:
    def run(swim: Swim) -> tuple[int, list[str]]:
        swim.merge([
            MemberUpdate(state="zombie", incarnation=1, node_id="b", hello=hello("b")),  # no such state
            MemberUpdate(state=ALIVE, incarnation=1, node_id="b" * (MAX_ID + 1), hello=hello("b" * (MAX_ID + 1))),
            MemberUpdate(state=ALIVE, incarnation=1, node_id="b", hello=hello("c")),  # another's Hello
            MemberUpdate(state=ALIVE, incarnation=1, node_id="b", hello=Hello(node_id="b")),  # no address
        ])
        return swim.invalid, swim.table.alive_ids()

    assert lone(run) == (4, [])


class _Backoff:
    """node-1's network, to node-0 alone: its first ``fails`` Hellos fail at once, as gRPC fails a call on a channel
    still in its reconnect backoff (node-0 had refused our static Hellos until it served); then node-0 answers."""

    authentication = "none"

    def __init__(self, fails: int) -> None:
        self.fails, self.hellos = fails, 0

    def link(self, address: str) -> _Backoff:
        return self

    def forget(self, address: str) -> None:
        pass

    def heard(self, address: str, node_id: str) -> None:
        pass

    async def confirm(self, address: str, reply: HelloReply, hello: Callable[[], Hello], timeout: float) -> bool:
        return True

    async def hello(self, hello: Hello, timeout: float) -> HelloReply:
        self.hellos += 1
        if self.hellos <= self.fails:
            raise PeerUnreachable("unavailable", "refuses connections (nothing listens on that port)")
        return HelloReply(**vars(says("node-0")), accepted=True)


def says(node_id: str) -> Hello:
    return member_hello(node_id, f"{node_id}:1", node_id)


def node_one(fails: int) -> tuple[Membership, _Backoff]:
    """node-1's membership (default settings: periods of 1 s, peer_timeout 4 s), whose first ``fails`` Hellos to
    node-0 fail at once (:class:`_Backoff`)."""
    clock, network = Clock(), _Backoff(fails)
    metrics = NodeMetrics("node-1", status=lambda: None)  # type: ignore[arg-type,return-value]  # never scraped
    membership = Membership("node-1", "node-1:1", MembershipSettings(), clock, hello=lambda: says("node-1"),
                            profile=lambda: NodeProfile("node-1", MODEL, SAMPLES),
                            fingerprint_of=lambda model: FINGERPRINT, network=network,  # type: ignore[arg-type]
                            tally=Tally(clock, metrics, RoundProgress(clock)),
                            on_join=lambda peer, restarted: None, on_lost=lambda peer: None, seed=1)
    return membership, network


def test_a_hello_back_that_failed_at_once_does_not_hold_off_the_next_greeting() -> None:
    """The testbed ≡ simulator flake: node-0's start-up Hello reached node-1, whose Hello back failed at once (its
    channel to node-0 still in its reconnect backoff). Left pending, node-0 made every greeting of it — its gossip's
    here, a new holder's — pass as a Hello in flight for peer_timeout, and node-1 planned a round without it."""
    async def main() -> tuple[list[str], int]:
        membership, network = node_one(fails=1)
        assert membership.answer(says("node-0"), "node-0:1").accepted  # its Hello; ours back fails
        await asyncio.sleep(0.1)
        membership.swim.merge([MemberUpdate(state=ALIVE, incarnation=1, node_id="node-0", hello=says("node-0"))])
        await asyncio.sleep(0.1)  # its gossip: greeted, and confirmed, at once
        return membership.alive_ids(), network.hellos

    assert run_virtual(main()) == (["node-0"], 2)


def test_a_stranger_confirmed_before_our_hello_back_goes_out_is_still_greeted() -> None:
    """A stranger's Hello schedules ours back; our own probe of it, already under way, confirms it first (its
    pending entry goes): the Hello back still goes out, to the address it gave, instead of failing on the entry."""
    async def main() -> tuple[list[str], int]:
        membership, network = node_one(fails=0)
        probing = asyncio.ensure_future(membership.table.probe("node-0:1"))
        assert membership.answer(says("node-0"), "node-0:1").accepted
        await probing
        await asyncio.sleep(0.1)
        return membership.alive_ids(), network.hellos

    assert run_virtual(main()) == (["node-0"], 2)


def test_a_holder_greets_the_members_its_token_names_each_period_until_they_answer() -> None:
    """A holder's greetings of a member that has just started may fail at once (our channel to it in its reconnect
    backoff): it greets it again a period later, rather than waiting out peer_timeout without it."""
    async def main() -> tuple[list[str], float]:
        membership, _ = node_one(fails=2)
        membership.swim.merge([MemberUpdate(state=ALIVE, incarnation=1, node_id="node-0", hello=says("node-0"))])
        await asyncio.sleep(0.1)  # its gossip's greeting fails
        loop = asyncio.get_running_loop()
        started = loop.time()
        await membership.wait_alive(["node-0", "node-1"], timeout=4.0)  # so does the holder's first
        return membership.alive_ids(), loop.time() - started

    alive, waited = run_virtual(main())
    assert alive == ["node-0"] and waited <= 1.5, waited


def test_the_gossip_queue_is_bounded_and_sends_each_update_log_n_times() -> None:
    gossip = PiggybackQueue(retransmit_mult=4, per_message=8, capacity=20)
    for i in range(30):
        gossip.add(MemberUpdate(state=ALIVE, incarnation=1, node_id=f"n{i}"))
    assert len(gossip) == 20
    assert gossip.limit(10) == 8 and gossip.limit(1000) == 16
    sent = [u.node_id for _ in range(100) for u in gossip.take(10)]
    assert all(len(batch) <= 8 for batch in [sent[i:i + 8] for i in range(0, len(sent), 8)])
    assert sorted(set(sent)) == sorted(f"n{i}" for i in range(10, 30)) and len(sent) == 20 * 8
    gossip.add(MemberUpdate(state=SUSPECT, incarnation=1, node_id="x"))
    gossip.add(MemberUpdate(state=DEAD, incarnation=1, node_id="x"))  # replaces what was queued about x
    assert [u.state for u in gossip.take(10)] == [DEAD]


def test_the_gossip_queue_picks_what_a_full_sort_would() -> None:
    """The queue's heaps against the rule written plainly: fewest sends first, newest first among equals, the most
    sent (oldest) dropped beyond capacity, each update dropped once sent ``limit`` times."""
    rng = random.Random(7)
    gossip = PiggybackQueue(retransmit_mult=2, per_message=3, capacity=12)
    plain: dict[str, list[Any]] = {}  # id -> [update, sent, order]
    added = 0
    for _ in range(3000):
        if rng.random() < 0.45:
            added += 1
            update = MemberUpdate(state=rng.choice([ALIVE, SUSPECT, DEAD]), incarnation=added,
                                  node_id=f"n{rng.randrange(30)}")
            gossip.add(update)
            plain[update.node_id] = [update, 0, added]
            if len(plain) > 12:
                del plain[max(plain.values(), key=lambda q: (q[1], -q[2]))[0].node_id]
        else:
            members = rng.choice([5, 50, 500])
            chosen = sorted(plain.values(), key=lambda q: (q[1], -q[2]))[:3]
            for q in chosen:
                q[1] += 1
                if q[1] >= gossip.limit(members):
                    del plain[q[0].node_id]
            assert gossip.take(members) == [q[0] for q in chosen]
        assert len(gossip) == len(plain)


def test_a_ping_with_its_updates_crosses_the_wire_unchanged() -> None:
    ping = Ping(sender="a", target="b", target_address="b:1", timeout_s=0.4, updates=(
        MemberUpdate(state=ALIVE, incarnation=2**40, node_id="a", hello=hello("a", 3)),
        MemberUpdate(state=SUSPECT, incarnation=7, node_id="c", sender="a")))
    assert from_wire(to_wire(ping)) == ping
    ack = PingAck(ok=True, updates=(MemberUpdate(state=DEAD, incarnation=1, node_id="c", sender="b"),))
    assert from_wire(to_wire(ack)) == ack


def test_a_message_is_sized_field_by_field_however_often_its_parts_were_sized() -> None:
    """The simulator's byte estimate (remembered Hellos, updates written out) against the rule written plainly."""
    def plain(value: Any) -> int:
        if value is None:
            return 0
        if isinstance(value, dict):
            return sum(2 + plain(k) + plain(v) for k, v in value.items())
        if isinstance(value, tuple | list):
            return sum(map(plain, value))
        if hasattr(value, "__dataclass_fields__"):
            return 2 + sum(plain(getattr(value, f)) for f in value.__dataclass_fields__)
        if not value:  # protobuf leaves a default out
            return 0
        if isinstance(value, str | bytes):
            return 2 + len(value)
        if isinstance(value, bool | float):
            return 2 if isinstance(value, bool) else 9
        return 1 + max(1, (value.bit_length() + 6) // 7)

    shared = hello("a", 3)
    updates = (MemberUpdate(state=ALIVE, incarnation=2**40, node_id="a", hello=shared),
               MemberUpdate(state=SUSPECT, incarnation=7, node_id="c", sender="a"),
               MemberUpdate(state=ALIVE, incarnation=1, node_id="a", sender="b", hello=shared))
    for message in (Ping(sender="a", target="b", timeout_s=0.4, updates=updates), PingAck(ok=True, updates=updates),
                    Ping(sender="b", sync=True, updates=updates[::-1]), shared):
        for _ in range(2):  # the second time from what was remembered
            assert message_size(message) == 10 + plain(message)


def idle(tmp_path: Path, nodes: int, duration: float, faults: FaultSchedule | None = None) -> dict[str, Any]:
    simulation = SimulationSettings(faults=faults or FaultSchedule())
    config = IDLE.model_copy(update={"nodes": nodes, "simulation": simulation})
    result = run_fleet(config, "defkt", tmp_path, mode="async", duration=duration, participation=0.001)
    assert result.membership is not None
    return result.membership


def test_an_idle_fleet_probes_at_a_constant_rate_and_suspects_nobody(tmp_path: Path) -> None:
    small, large = idle(tmp_path / "10", 10, 60), idle(tmp_path / "40", 40, 60)
    for figures in (small, large):
        assert figures["false_suspicions"] == 0 and figures["false_deaths"] == 0, figures
        assert figures["joins_unfinished"] == 0 and figures["join_s"] <= 10, figures  # everyone knew everyone
    # a probe (ping and ack) a period, plus the start's Hellos and push-pulls: not four times as many at 4x the nodes
    assert 2 <= small["messages_per_node_s"] <= 3 and large["messages_per_node_s"] <= 1.5 * small["messages_per_node_s"]


def test_a_kill_is_known_to_every_live_member_within_the_stated_bound(tmp_path: Path) -> None:
    faults = FaultSchedule(kills=[KillFault(at=20, node="node-3", down_for=1000)])
    figures = idle(tmp_path, 10, 120, faults)
    bound = detection_bound(MembershipSettings(), 10)
    [detection] = figures["detections"]
    assert detection["node"] == "node-3" and detection["all_s"] is not None, figures
    assert MembershipSettings().peer_timeout <= detection["all_s"] <= bound == figures["detection_bound_s"], figures
    assert figures["false_deaths"] == 0, figures


@pytest.mark.slow  # a minute of one core: first, beside the other long tests, not alone at the end
def test_at_a_thousand_members_a_kill_and_a_newcomer_are_known_everywhere_within_their_bounds() -> None:
    """The membership at N = 1,000 (the memberships alone: :mod:`tests.membership_fleet`): once the fleet has met (its
    start known everywhere), a kill -9 is known dead by every live member within :func:`detection_bound`, and a new
    member, which lists the fleet but which nobody lists, is known by every member within :func:`join_bound`:
    O(log N) periods. Measured here: ~22 s and ~16 s, against bounds of 95 s and 33 s."""
    settings, at = MembershipSettings(), 10.0
    figures, record = run_members(1000, at + 30, (Kill(at, "node-3"),), (at,))  # shorter than the bounds: stricter
    met = [record.join_time(f"node-{i}", 0.0) for i in range(1000)]
    assert None not in met and max(met) <= at, figures  # type: ignore[type-var]  # the fleet met before the events
    [detection] = figures["detections"]
    assert detection["node"] == "node-3" and detection["all_s"] is not None, figures
    assert detection["all_s"] <= detection_bound(settings, 1000), figures
    joined = record.join_time("new-0", at)
    assert joined is not None and joined <= join_bound(settings, 1000), (joined, figures)
    assert figures["false_suspicions"] == 0 and figures["false_deaths"] == 0, figures


def test_a_restarted_member_is_known_alive_again_everywhere(tmp_path: Path) -> None:
    faults = FaultSchedule(kills=[KillFault(at=20, node="node-5", down_for=40)])
    figures = idle(tmp_path, 10, 120, faults)
    assert figures["detections"][0]["all_s"] is not None and figures["joins_unfinished"] == 0, figures
