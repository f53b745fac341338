"""The payload hash: BLAKE3 where both ends offer it in Hello, sha256 otherwise; a receiver refuses
a header naming a hash it did not offer, with a reason, and keeps serving.

The codec's side in process; the negotiation against a real node (real gRPC on loopback); forged headers in
``test_node_hostile.py`` with the other hostile transfers.
"""

from __future__ import annotations

import dataclasses
import hashlib

import blake3
import pytest

from dfl_node import PROTOCOL_VERSION
from dfl_node.hashes import DEFAULT_HASH, OFFERED_HASHES, negotiate
from dfl_node.net import buffers
from dfl_node.net.assembler import MessageAssembler
from dfl_node.net.client import PeerClient
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import Hello
from tests.helpers.codec import assembler, assert_same_parts, feed_all, frames_of, make_msg
from tests.helpers.hostile import Target, stranger_hello


def reason(frames, **kw) -> str:
    with pytest.raises(TransferRejected) as err:
        feed_all(assembler(**kw), frames)
    return err.value.reason


def test_a_node_offers_blake3_first_and_sha256() -> None:
    assert OFFERED_HASHES == ("blake3", "sha256") and DEFAULT_HASH == "sha256"


@pytest.mark.parametrize(("ours", "theirs", "agreed"), [
    (("blake3", "sha256"), ("blake3", "sha256"), "blake3"),
    (("blake3", "sha256"), ("sha256", "blake3"), "blake3"),  # our preference decides
    (("blake3", "sha256"), ("sha256",), "sha256"),  # a peer without the wheel
    (("blake3", "sha256"), (), "sha256"),  # a peer older than negotiation offers nothing
    (("blake3", "sha256"), ("md5", "crc32"), "sha256"),  # nothing we know
    (("sha256",), ("blake3", "sha256"), "sha256"),  # we lack it
])
def test_negotiate_takes_our_first_hash_the_peer_offers_else_sha256(ours, theirs, agreed) -> None:
    assert negotiate(ours, theirs) == agreed


@pytest.mark.parametrize("name", ["blake3", "sha256"])
def test_a_payload_round_trips_under_either_hash_and_the_header_names_it(name: str) -> None:
    msg = make_msg()
    frames = frames_of(msg, 256, hash=name)
    payload = b"".join(f.chunk.data for f in frames[1:])
    want = blake3.blake3(payload).digest() if name == "blake3" else hashlib.sha256(payload).digest()
    assert frames[0].header.hash == name and frames[0].header.digest == want
    header, got = feed_all(assembler(), frames)
    assert header.hash == name and [p.name for p in got.parts] == [p.name for p in msg.parts]


def test_a_header_naming_no_hash_is_sha256_from_an_older_sender() -> None:
    msg = make_msg()
    frames = frames_of(msg)
    frames[0].header.ClearField("hash")
    for offered in (("blake3", "sha256"), ("sha256",)):  # its sha256 digest checked, its message whole
        _, got = feed_all(assembler(hashes=offered), frames)
        assert_same_parts(got.parts, msg.parts)


def test_a_hash_we_did_not_offer_is_refused_before_anything_is_allocated() -> None:
    blake = frames_of(make_msg(), hash="blake3")
    assert reason(blake[:1], hashes=("sha256",)) == "hash_not_offered"  # at the header
    forged = frames_of(make_msg())
    forged[0].header.hash = "md5"
    asm = assembler()
    with pytest.raises(TransferRejected) as err:
        asm.feed(forged[0])
    assert err.value.reason == "hash_not_offered"
    assert "'md5'" in err.value.detail and "blake3, sha256" in err.value.detail  # what it named, what we offered
    assert asm.header is None  # nothing taken, no buffer


def test_a_corrupted_or_short_blake3_digest_is_refused_as_bad_blake3() -> None:
    frames = frames_of(make_msg(), 512, hash="blake3")
    data = bytearray(frames[2].chunk.data)
    data[0] ^= 1
    frames[2].chunk.data = bytes(data)
    assert reason(frames) == "bad_blake3"
    short = frames_of(make_msg(), hash="blake3")
    short[0].header.digest = b"\0" * 31
    assert reason(short) == "bad_blake3"


def test_the_intake_thread_holds_a_bounded_number_of_chunks() -> None:
    """A receiver that falls behind is told to wait (``behind``) once more than MAX_PENDING_CHUNKS chunks wait."""
    frames = frames_of(make_msg(), 16)
    asm = assembler()
    asm.feed(frames[0])
    for frame in frames[1:]:
        asm.feed(frame)
        behind = asm.behind()
        if behind is not None:
            behind.result()
        assert len(asm._pending) <= buffers.MAX_PENDING_CHUNKS + 1
    asm.finish()


# --- against a real node -------------------------------------------------------------------------------


def hello(t: Target) -> Hello:
    return Hello(protocol_version=PROTOCOL_VERSION, swarm=t.node.config.swarm, node_id="stranger",
                 fingerprint=t.node.identity.fingerprint, algorithm=t.node.config.algorithm, boot_id="b",
                 model=t.node.identity.model)


@pytest.mark.parametrize(("offers", "agreed"), [(("blake3", "sha256"), "blake3"), (("sha256",), "sha256")])
async def test_a_push_carries_the_hash_both_ends_offer(target: Target, offers: tuple[str, ...], agreed: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ends negotiate BLAKE3 in Hello; a peer that offers only sha256 (no wheel) gets sha256; either way
    the node takes the model."""
    seen: list[str] = []
    finish = MessageAssembler.finish

    def recording(self: MessageAssembler):  # type: ignore[no-untyped-def]
        header, message = finish(self)
        seen.append(header.hash)
        return header, message

    monkeypatch.setattr(MessageAssembler, "finish", recording)
    client = PeerClient(f"127.0.0.1:{target.node.config.network.grpc_port}",
                        dataclasses.replace(target.node.network.wire, hashes=offers))  # type: ignore[attr-defined]
    try:
        assert client.hash == "sha256"  # before any Hello
        reply = await client.hello(hello(target), timeout=5)
        assert reply.accepted and client.hash == agreed
        await target.expect()
        accepted: list[bool] = []
        await client.push(target.message(), 0, timeout=10, on_accepted=lambda: accepted.append(True))
        assert accepted == [True] and seen == [agreed]
    finally:
        await client.close()
    await target.node.roles.settled()
    assert target.node.tally.counters["fusions"] == 1 and (await target.rejected()) == {}


async def test_a_node_offers_its_hashes_in_every_hello_reply(target: Target) -> None:
    accepted = await target.stub.Hello(stranger_hello(target), timeout=5)
    refused = await target.stub.Hello(stranger_hello(target, swarm="other"), timeout=5)
    assert tuple(accepted.hashes) == tuple(refused.hashes) == OFFERED_HASHES

