"""Resuming a cut transfer, piece by piece: the codec goes on from the bytes a receiver verified, bit for bit; an
aggregator's collector keeps what arrived (and its memory) for ``resume_window``, hands it to the resumed transfer,
confirms one whose message had arrived whole, and stops waiting once the window is over.

Whole transfers through a link that drops are ``test_weak_links.py``'s (real daemons, a proxy) and
``test_sim_links.py``'s (the simulator)."""

from __future__ import annotations

import pytest
import torch

from dfl_node.algorithms.plan import Group, Step
from dfl_node.net.encoder import copy_header, prepare
from dfl_node.net.frames import decode_frame
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.node.exchange.collector import Collector
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import Offer
from dfl_node.peering.resume import Resume, chunk_size
from dfl_node.sim.clock import VirtualClock, run_virtual
from dfl_node.sim.payloads import payload_key
from tests.helpers.codec import FP, SWARM, assembler, assert_same_parts, make_msg


def read(frames: list) -> list:
    return [decode_frame(frame) if isinstance(frame, bytes) else frame for frame in frames]


@pytest.mark.parametrize("cut_after", [0, 1, 3, 6])
def test_a_transfer_cut_after_any_chunk_resumes_to_the_same_message_bit_for_bit(cut_after: int) -> None:
    msg = make_msg()
    outgoing = prepare(msg, swarm=SWARM, fingerprint=FP)
    first = read(list(outgoing.frames(chunk_size=512)))
    receiver = assembler()
    for frame in first[: 1 + cut_after]:  # the header, then ``cut_after`` chunks: then the link dropped
        receiver.feed(frame)
    with pytest.raises(TransferRejected, match="truncated"):
        receiver.ended()
    held = receiver.received
    assert held == min(cut_after * 512, outgoing.header.total_size)

    resumed = copy_header(outgoing.header, resume=True)  # the next stream's header: the same payload, resumed
    assert receiver.continues(resumed)
    receiver.resume(resumed, held)
    rest = read(list(outgoing.chunks(held, 512)))
    assert sum(memoryview(f).nbytes for f in rest) == outgoing.header.total_size - held  # nothing sent twice
    for frame in rest:
        receiver.feed(frame)
    _, got = receiver.finish()  # the digest of the whole payload checks
    assert_same_parts(got.parts, msg.parts)


def test_a_resumed_stream_of_another_payload_or_from_another_place_is_refused() -> None:
    outgoing = prepare(make_msg(), swarm=SWARM, fingerprint=FP)
    receiver = assembler()
    frames = read(list(outgoing.frames(chunk_size=512)))
    receiver.feed(frames[0])
    receiver.feed(frames[1])
    other = prepare(make_msg(round=43), swarm=SWARM, fingerprint=FP).header  # another round: another payload
    assert not receiver.continues(other)
    with pytest.raises(TransferRejected, match="bad_resume"):
        receiver.resume(copy_header(other, resume=True), 512)
    with pytest.raises(TransferRejected, match="bad_resume"):  # not where the held bytes end
        receiver.resume(copy_header(outgoing.header, start=1024), 1024)
    with pytest.raises(TransferRejected, match="bad_resume"):  # a stream that goes on from bytes never received
        assembler().feed(pb.Frame(header=copy_header(outgoing.header, start=512)))


def test_a_chunk_asked_for_is_bounded_both_ways() -> None:
    assert chunk_size(0, 1 << 20) == 1 << 20  # none asked: the default
    assert chunk_size(64 << 10, 1 << 20) == 64 << 10
    assert chunk_size(1, 1 << 20) == 16 << 10  # a peer cannot ask for frames of a byte
    assert chunk_size(10 << 20, 1 << 20) == 1 << 20  # nor for more than a frame may be


def test_resume_counts_what_was_sent_again() -> None:
    resume = Resume(size=1000)
    resume.attempts, resume.sent = 1, 1000
    assert resume.resent == 0  # one whole stream
    resume.attempts, resume.sent = 3, 1400
    assert resume.resent == 400 and not Resume().resuming


# ----------------------------------------------------------------------------- the aggregator's side

KEY = b"digest-of-node-1's-model"


def offer(resume: bool = False, key: bytes = KEY) -> Offer:
    return Offer(sender="node-1", round=0, epoch=1, purpose="defkt.model", total_size=800, digest=key,
                 resume=resume)


def collector(clock: VirtualClock, window: float = 5.0) -> Collector:
    """node-0's inbox for round 0 (epoch 1): node-1 sends to it, and node-2 may (at most 1000 bytes at once)."""
    return Collector(Step(0, Group("node-0", ("node-1", "node-2"))), 1, clock, deadline_s=60.0, max_bytes=1000,
                     expected=("node-1",), resume_window=window)


def test_a_cut_transfer_is_kept_with_its_memory_and_handed_to_its_resumption() -> None:
    async def play() -> None:
        clock = VirtualClock()
        inbox = collector(clock)
        assert inbox.admit(offer()).held is None
        inbox.interrupt("node-1", KEY, held="the first 512 bytes")
        assert inbox.reserved == 800 and inbox.missing() == {"node-1"}  # still reserved, still waited for
        inbox.expected.add("node-2")
        with pytest.raises(TransferRejected, match="over_memory"):  # another 800 bytes do not fit beside it
            inbox.admit(Offer(sender="node-2", round=0, epoch=1, total_size=800))
        assert inbox.admit(offer(resume=True)).held == "the first 512 bytes"
        assert inbox.partials == {} and inbox.receiving == {"node-1": 800}

    run_virtual(play())


def test_a_fresh_transfer_or_another_payload_starts_over() -> None:
    async def play() -> None:
        inbox = collector(VirtualClock())
        inbox.admit(offer())
        inbox.interrupt("node-1", KEY, held="part")
        assert inbox.admit(offer(resume=True, key=b"another model")).held is None  # not what is held: from 0
        inbox.interrupt("node-1", b"another model", held="part")
        assert inbox.admit(offer(resume=False, key=b"another model")).held is None  # not a resumption: from 0

    run_virtual(play())


def test_a_resumed_transfer_of_a_message_that_arrived_gets_its_confirmation_even_after_the_group() -> None:
    async def play() -> None:
        inbox = collector(VirtualClock())
        inbox.admit(offer())
        message = make_msg(sender="node-1", round=0)
        reply = inbox.deliver(message, KEY)
        assert inbox.admit(offer(resume=True)).arrived is reply  # cut while it waited: the same confirmation
        inbox.answer({})
        inbox.close()
        assert inbox.messages == {}  # the fused model is not kept for it
        admitted = inbox.admit(offer(resume=True))
        assert admitted.arrived is reply and admitted.arrived.result() is None
        with pytest.raises(TransferRejected, match="too_late"):
            inbox.admit(offer(resume=True, key=b"another model"))

    run_virtual(play())


def test_a_sender_that_does_not_resume_within_the_window_is_no_longer_waited_for() -> None:
    async def play() -> tuple[list, float]:
        clock = VirtualClock()
        inbox = collector(clock, window=5.0)
        inbox.admit(offer())
        inbox.interrupt("node-1", KEY, held="part")
        started = clock.monotonic()
        gathered = await inbox.wait()
        return gathered, clock.monotonic() - started

    gathered, waited = run_virtual(play())
    assert gathered == [] and waited == pytest.approx(5.0)  # the window, not the deadline (60 s)


def test_with_no_window_a_cut_transfer_is_dropped_at_once() -> None:
    async def play() -> Collector:
        inbox = collector(VirtualClock(), window=0.0)
        inbox.admit(offer())
        inbox.interrupt("node-1", KEY, held="part")
        return inbox

    inbox = run_virtual(play())
    assert inbox.missing() == set() and inbox.partials == {} and inbox.reserved == 0


def test_the_simulator_knows_a_payload_by_its_values_as_the_wire_by_its_digest() -> None:
    msg = make_msg()
    changed = make_msg({**{p.name: p.values.reshape(p.shape) for p in msg.parts}, "conv.bias": torch.zeros(8)})
    assert payload_key(msg) == payload_key(make_msg()) != payload_key(changed)  # a resumed push must name the same
