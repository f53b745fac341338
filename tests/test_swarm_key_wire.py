"""A man in the middle between two swarm-key nodes: a TCP proxy on the path of a model transfer.

- Passing bytes through, it captures the stream: without a key the sent model's float32 bytes are there in clear
  (the check can fail), with the key (TLS 1.3) none of them is.
- Flipping one byte of the transfer in transit: without a key the receiver's payload digest catches it (counted as
  a bad digest; a proxy that rewrote the digest too would pass), with the key the TLS connection breaks before
  anything reaches the codec — nothing fused, the receiver's model unchanged, and it still takes the next model.

Nodes in this process over real gRPC on loopback (run inside ``unshare -n``, as every networked test).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import build_model
from dfl_node.net.auth import NO_SECURITY, load_security
from dfl_node.net.certs import new_secret
from dfl_node.node.node import Node
from dfl_node.peering.errors import PeerUnreachable, TransferRefused
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import order, quiet_node_config, running

FLIP_AT = 8000  # an offset of the sender's stream inside the model's payload (the model is ~14 KB)
WINDOW = 64  # bytes of a tensor looked for in the capture


class Proxy:
    """Forwards TCP connections to ``target``; keeps what the dialing side sent, flipping one bit of it at ``flip_at``
    (on every connection: gRPC's own retries get no clean copy through)."""

    def __init__(self, target: int, flip_at: int | None = None) -> None:
        self.target, self.flip_at = target, flip_at
        self.captured = bytearray()
        self.answered = bytearray()  # what the node sent back
        self.flipped = 0

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        try:
            yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(self._pipe(reader, upstream_writer, upstream=True),
                             self._pipe(upstream_reader, writer, upstream=False))

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, upstream: bool) -> None:
        offset = 0
        try:
            while data := await source.read(1 << 16):
                if upstream:
                    chunk = bytearray(data)
                    if self.flip_at is not None and offset <= self.flip_at < offset + len(chunk):
                        chunk[self.flip_at - offset] ^= 0x01
                        self.flipped += 1
                    offset += len(chunk)
                    self.captured += chunk
                    data = bytes(chunk)
                else:
                    self.answered += data
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()


def _message(node: Node, seed: int, round_: int) -> ModelMessage:
    """A genuine model of node-1's, for node-0's group of ``round_``."""
    cfg = node.config
    model = build_model(cfg.learning.model, (1, 8, 8), 10, hidden=cfg.learning.hidden, seed=seed)
    return ModelMessage(sender="node-1", round=round_, purpose="defkt.model", num_samples=100,
                        parts=parts_from_state(model.state_dict()), model=node.identity.model)


async def _aggregate(node: Node, round_: int) -> None:
    """Make ``node`` the aggregator of a group of ``round_`` whose one sender is node-1."""
    ack = await node.roles.play(order(round=round_, role="aggregator", aggregator="node-0", senders=("node-1",),
                                      deadline_s=30))
    assert ack.ok, ack


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "swarm-key"])
async def test_a_man_in_the_middle_reads_no_model_and_a_flipped_byte_breaks_the_connection(
        fleet_shards: Path, tmp_path: Path, keyed: bool) -> None:
    key = new_secret(tmp_path / "swarm.key") if keyed else None
    port = free_port()
    config = quiet_node_config(fleet_shards, tmp_path / "node-0", grpc_port=port, swarm_key_file=key, mode="async",
                               interval=3600)
    # node-1's side: its own credentials (a certificate it issues itself from the key), dialing through the proxy
    sender = load_security("node-1", swarm_key_file=key, hosts=("127.0.0.1",)) if keyed else NO_SECURITY
    async with running(config) as node:
        assert node.status().authentication == ("swarm-key" if keyed else "none")
        from dfl_node.net.client import PeerClient  # noqa: PLC0415 - the node's own client path, as a peer dials

        # 1. a byte flipped in transit
        digest, fusions = node.learner.digest, node.tally.counters["fusions"]
        tamper = Proxy(port, flip_at=FLIP_AT)
        message = _message(node, seed=7, round_=0)
        assert message.nbytes > 1.5 * FLIP_AT
        async with tamper.serving() as address:
            client = PeerClient(address, node.network.wire, sender, tls_name="node-0")
            await _aggregate(node, 0)
            if keyed:  # TLS: the record fails its integrity check, the connection breaks
                with pytest.raises((PeerUnreachable, TransferRefused)):
                    await client.push(message, 0, timeout=10)
            else:  # in clear, the flipped payload reaches the codec, whose digest catches it
                with pytest.raises(TransferRefused) as refused:
                    await client.push(message, 0, timeout=10)
                assert refused.value.reason.startswith("bad_")
            await client.close()
        assert tamper.flipped >= 1
        if node.roles.collector is not None:  # the sender never completes: end the group before its deadline
            node.roles.collector.close()
        await node.roles.settled()
        assert node.learner.digest == digest and node.tally.counters["fusions"] == fusions  # nothing fused
        bad_digests = sum(count for reason, count in node.tally.rejected.items() if reason.startswith("bad_"))
        assert bad_digests == (0 if keyed else 1)  # with TLS nothing tampered ever reached the codec

        # 2. the same path, untouched: the model arrives and is fused; what crossed the path is captured
        tap = Proxy(port)
        message = _message(node, seed=8, round_=1)
        async with tap.serving() as address:
            client = PeerClient(address, node.network.wire, sender, tls_name="node-0")
            await _aggregate(node, 1)
            await client.push(message, 0, timeout=10)
            await client.close()
        await node.roles.settled()
        assert node.tally.counters["fusions"] == fusions + 1 and node.learner.digest != digest
        biggest = max(message.parts, key=lambda p: p.values.numel()).values.numpy().astype("<f4").tobytes()
        windows = [biggest[i:i + WINDOW] for i in range(0, len(biggest) - WINDOW, WINDOW)]
        in_clear = sum(window in tap.captured for window in windows)
        if keyed:
            assert in_clear == 0, f"{in_clear} of {len(windows)} runs of the model's bytes crossed in clear"
            # the node's first record is its ServerHello, which chose TLS 1.3: supported_versions (0x002b) = 0x0304
            hello = tap.answered[:5 + int.from_bytes(tap.answered[3:5], "big")]
            assert hello[0] == 0x16 and hello[5] == 0x02 and bytes.fromhex("002b00020304") in hello
        else:
            assert in_clear > len(windows) // 2  # the capture does hold a model in clear when it is not encrypted
