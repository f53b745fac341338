"""Fuzzing all six RPCs of a real node over gRPC ("Hostile input"), with hypothesis.

Why: every RPC takes bytes from anyone who can reach the port, and what the codec refuses in-process
(test_fuzz_codec.py) must also be refused, counted and harmless when it arrives over the wire: random
bytes, pickles and mangled frames as the request of every method, well-formed requests with wrong
content (incompatible Hellos, bad probes, assignments of no real role from huge epochs, tokens of another
seed, pulls for another swarm), transfers with wrong headers, and the transfer an aggregator waits for
with a malformed payload or NaN/Inf values. The suite checks what the issue asks of the node:

* this file's share of the 10,000 malformed inputs (tests/fuzz_figures.py) tried, and 0 crashes: every
  one is refused with a reason (never an exception, an INTERNAL/UNKNOWN status or an ERROR log line),
  and the node keeps serving (a valid Hello and a genuine transfer succeed after the flood);
* 0 state changes: its weights (a hash of the values, not the architecture fingerprint), its
  checkpoint files, its peer table and its round/epoch/token state are what they were;
* every refusal counted, by reason, in ``state.rejected`` (and so ``/status``): exactly one count per
  refused request, under the reason the peer was told;
* RSS and open file descriptors bounded.

The node (round mode, defkt-select with probes, on loopback: tests/fuzz_node.py) is started once for
the module, by the first of its tests, and the RSS and fd baselines are taken then; the last test checks
the totals and prints the figures (run with ``-s`` to see them). Hypothesis is derandomized: the same
cases, and the same figures, every run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.message import DecodeError
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dfl_node import PROTOCOL_VERSION
from dfl_node.net.frames import decode_frame
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.testbed.launcher import free_port
from tests.fuzz_figures import open_fds, rss_mb
from tests.fuzz_frames import FRAME_BYTES, LIMITS, mutated_headers, mutated_streams, poisoned_states
from tests.fuzz_node import BUSY, FIGURES, REQUESTS, STATE_CHANGES, LiveNode, flood, identity, send_genuine
from tests.fuzz_strategies import (
    FUZZ,
    genuine_probe,
    mutated_probes,
    other,
    set_different,
    texts,
    uint32s,
    uint64s,
)
from tests.helpers.codec import encoded_frames
from tests.helpers.fleet import fleet_node_config

GRPC_MAX = LIMITS.max_message_bytes  # a bigger message is refused by gRPC itself, before the node sees it


@pytest.fixture(scope="module")
def live(fleet_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    config = fleet_node_config(id="node-0", data=fleet_shards / "node-0", grpc_port=free_port(), http_port=free_port(),
                               mdns=False, swarm=f"fuzz-{uuid.uuid4().hex[:6]}",
                               state_dir=tmp_path_factory.mktemp("fuzzed"),
                               algorithm="defkt-select", selection="probe-samples")  # round mode: epochs, token in play
    with FIGURES.errors_logged():
        node = LiveNode(config)
        try:
            node.start()
            FIGURES.take_baseline()  # with the node up, before the flood
            yield node
        finally:
            node.close()


def genuine(live: LiveNode, method: str, raw: bytes) -> bool:
    """Whether random bytes happen to be a request the protocol honours (a compatible Hello, a token with our
    seed, an assignment of a real role, a pull or probe for our swarm): not malformed, so not sent."""
    try:
        request = REQUESTS[method].FromString(raw)
    except DecodeError:
        return False
    cfg = live.config
    if method == "Hello":
        return request.protocol_version == PROTOCOL_VERSION and request.swarm == cfg.swarm
    if method == "PassToken":
        return request.seed == cfg.learning.seed
    if method == "Assign":
        return request.role in ("sender", "aggregator")
    return request.swarm == cfg.swarm


METHODS = ["Hello", "Transfer", "Pull", "Probe", "Assign", "PassToken"]


@pytest.mark.parametrize("method", METHODS)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_random_bytes_as_every_request(live: LiveNode, method: str, data: st.DataObject) -> None:
    """Random bytes, pickles and mangled frames as the serialized request of every method (for Transfer:
    streams of such frames, or none at all)."""
    if method == "Transfer":
        requests: list[Any] = data.draw(st.lists(st.lists(FRAME_BYTES, max_size=4), min_size=1, max_size=8))
    else:
        requests = [raw for raw in data.draw(st.lists(FRAME_BYTES, min_size=1, max_size=8))
                    if not genuine(live, method, raw)]
        assume(requests)
    flood(live, method, requests)


def _hello_base(live: LiveNode) -> pb.HelloRequest:
    return pb.HelloRequest(protocol_version=PROTOCOL_VERSION, swarm=live.config.swarm, node_id="stranger",
                           fingerprint=live.node.identity.fingerprint, algorithm=live.config.algorithm,
                           grpc_address="127.0.0.1:1", boot_id="b", model=live.node.identity.model)


@st.composite
def bad_hellos(draw: st.DrawFn, base: pb.HelloRequest) -> bytes:
    """A Hello incompatible in one to three ways, with junk (long strings, pickles) in its other fields."""
    h = pb.HelloRequest()
    h.CopyFrom(base)
    for name in draw(st.lists(st.sampled_from(["protocol_version", "swarm", "fingerprint", "algorithm", "model"]),
                              min_size=1, max_size=3, unique=True)):
        set_different(draw, h, name, uint32s if name == "protocol_version" else texts)
    if draw(st.booleans()):
        h.node_id, h.grpc_address, h.boot_id, h.status_url = (draw(texts) for _ in range(4))
        h.http_port, h.num_samples = draw(uint32s), draw(uint64s)
    return h.SerializeToString()


@st.composite
def bad_assignments(draw: st.DrawFn, node_id: str) -> bytes:
    """An assignment of no real role (or an aggregator with candidates), from any epoch and round."""
    role = draw(st.one_of(texts, st.sampled_from(["idle", "source", "candidate", "holder", "AGGREGATOR", "sender "])))
    if role in ("sender", "aggregator"):
        role += "\x00"
    candidates = []
    if draw(st.booleans()):
        role, candidates = "aggregator", draw(st.lists(texts, min_size=1, max_size=4))
    request = pb.RoundAssignment(round=draw(uint64s), epoch=draw(uint64s), holder=draw(texts), role=role,
                                 aggregator=draw(st.sampled_from([node_id, "stranger"])), senders=["stranger"],
                                 aggregator_address=draw(texts), candidates=candidates, pull=draw(st.booleans()),
                                 deadline_s=draw(st.floats(allow_nan=True, allow_infinity=True)),
                                 state=draw(st.dictionaries(texts, texts, max_size=3)))
    return request.SerializeToString()


@st.composite
def bad_tokens(draw: st.DrawFn, node_id: str, seed: int) -> bytes:
    """A round token with a seed other than the swarm's, naming us holder or not, done or not, any epoch."""
    request = pb.RoundToken(round=draw(uint64s), epoch=draw(uint64s), holder=draw(st.sampled_from([node_id, "x"])),
                            seed=other(seed, draw(uint64s)), members=draw(st.lists(texts, max_size=4)),
                            done=draw(st.booleans()), state=draw(st.dictionaries(texts, texts, max_size=3)))
    return request.SerializeToString()


@st.composite
def bad_pulls(draw: st.DrawFn, swarm: str) -> bytes:
    request = pb.PullRequest(aggregator=draw(texts), swarm=other(swarm, draw(texts)), round=draw(uint64s),
                             epoch=draw(uint64s), state=draw(st.dictionaries(texts, texts, max_size=3)))
    return request.SerializeToString()


@st.composite
def bad_probe_bytes(draw: st.DrawFn, base: pb.ProbeRequest) -> bytes:
    p = draw(mutated_probes(base))
    if draw(st.integers(0, 5)) == 0:
        p.swarm = other(base.swarm, draw(texts))
    return p.SerializeToString()


@pytest.mark.parametrize("method", ["Hello", "Probe", "Assign", "PassToken", "Pull"])
@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_malformed_messages_to_every_unary_method(live: LiveNode, method: str, data: st.DataObject) -> None:
    """Well-formed protobuf, wrong content: incompatible Hellos, bad probes (NaN samples, huge shapes, pickles),
    assignments of no real role from huge epochs, tokens of another seed, pulls for another swarm."""
    cfg = live.config
    strategy = {
        "Hello": bad_hellos(_hello_base(live)),
        "Probe": bad_probe_bytes(genuine_probe(cfg.swarm)),
        "Assign": bad_assignments(cfg.id),
        "PassToken": bad_tokens(cfg.id, cfg.learning.seed),
        "Pull": bad_pulls(cfg.swarm),
    }[method]
    flood(live, method, data.draw(st.lists(strategy, min_size=1, max_size=8)))


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_mutated_headers_over_grpc(live: LiveNode, data: st.DataObject) -> None:
    """Transfers whose header is wrong (and, when its checks pass, that no group expects), concurrently."""
    frames = live.genuine_frames
    header = pb.Frame.FromString(frames[0]).header
    headers = data.draw(st.lists(mutated_headers(header), min_size=1, max_size=6))
    flood(live, "Transfer", [[pb.Frame(header=h).SerializeToString(), *frames[1:]] for h in headers])


@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_mutated_payloads_to_an_expecting_aggregator(live: LiveNode, data: st.DataObject) -> None:
    """The transfer the node waits for (a genuine header from its sender), with a malformed payload or
    NaN/Inf values: refused after admission, the group given up, nothing fused."""
    frames = live.genuine_frames
    if poisoned := data.draw(st.integers(0, 3)) == 0:
        state = data.draw(poisoned_states(live.genuine_state))
        stream = encoded_frames(live.message(state=state), data.draw(st.integers(512, 8192)),
                                swarm=live.config.swarm, fingerprint=live.node.identity.fingerprint)
    else:
        payload = b"".join(bytes(decode_frame(raw)) for raw in frames[1:])
        header = pb.Frame.FromString(frames[0]).header
        stream = [frames[0], *data.draw(mutated_streams(payload, header, oversize=GRPC_MAX - 64))]
    reasons = flood(live, "Transfer", [stream], expected=True)
    assert reasons != ["not_expected"] and (reasons == ["non_finite"] or not poisoned), reasons


def test_the_node_is_unharmed_and_the_figures(live: LiveNode, request: pytest.FixtureRequest) -> None:
    """After the flood (the tests above, in file order): nothing was unpickled, nothing crashed, nothing
    changed, /status counts what state.rejected does, RSS and fds are bounded, and the node still accepts
    a genuine Hello and fuses a genuine model. Prints the figures."""
    # Under -n the file's tests run in this one process only if xdist grouped them (tests/conftest.py): it marks
    # a grouped test's id "@group", which pytest 9 does not let xdist 3.8 do (so pyproject.toml keeps pytest 8).
    assert "@" in request.node.nodeid or not getattr(request.config.option, "loadgroup", False), \
        "pytest-xdist split this file over its workers: install the versions in constraints.txt"
    rss, fds = rss_mb(), open_fds()
    rejected = live.rejected()
    with httpx.Client(trust_env=False) as http:
        status = http.get(f"http://127.0.0.1:{live.config.api.http_port}/status", timeout=10).json()
    assert status["rejected"] == dict(rejected)
    changed = live.baseline.changes(live.snapshot())

    async def hello() -> pb.HelloReply:
        call = live.channel.unary_unary("/dfl.v1.DflNode/Hello", request_serializer=identity,
                                        response_deserializer=pb.HelloReply.FromString)
        return await call(_hello_base(live).SerializeToString(), timeout=10)

    reply = live.run(hello())
    assert reply.accepted, reply
    fusions = live.call(lambda: live.node.tally.counters["fusions"])
    live.expect()
    assert live.run(send_genuine(live)) == (True, "")
    live.settle()
    assert live.call(lambda: live.node.tally.counters["fusions"]) == fusions + 1
    assert live.snapshot().weights != live.baseline.weights  # it did fuse

    FIGURES.report(rss, fds, {"state changes": len(STATE_CHANGES) + len(changed),
                              "rejected, by reason (the node's /status)": dict(sorted(rejected.items()))})
    assert not STATE_CHANGES and not changed, (STATE_CHANGES[:10], changed)
    # each once: every input here went over gRPC (but probes that met the node busy with another: not hostile)
    assert sum(rejected.values()) + len(BUSY) == sum(FIGURES.tried.values())
