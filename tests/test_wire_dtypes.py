"""Opt-in lossy models on the wire (``--wire-dtype float16|int8``): encoded by the sender, checked
against the receiver's own setting and the declared manifest, decoded back to the model's dtype, and the
simulator's networks losing exactly what the codec loses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.net.client import PeerClient
from dfl_node.net.manifest import Limits
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.wire_dtypes import EXACT, decode, encode, encoding, payload_bytes, through
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.names import WireDtype
from dfl_node.sim import run_fleet
from dfl_node.sim.payloads import wire_size
from tests.helpers.codec import assembler, feed_all, frames_of, make_msg
from tests.helpers.hostile import targeted

LOSSY = ("float16", "int8")


def reason(frames, **kw) -> str:
    with pytest.raises(TransferRejected) as err:
        feed_all(assembler(**kw), frames)
    return err.value.reason


def test_the_settings_name_exactly_the_encodings() -> None:
    assert WireDtype.__args__ == (EXACT, *LOSSY)  # type: ignore[attr-defined]


@pytest.mark.parametrize("wire_dtype", LOSSY)
def test_encode_then_decode_loses_at_most_half_a_step(wire_dtype: str) -> None:
    values = torch.randn(10_000, generator=torch.Generator().manual_seed(1)) * 3
    sent, scale = encode(values, wire_dtype)
    got = decode(sent, scale, torch.float32)
    assert got.dtype == torch.float32 and got.shape == values.shape
    if wire_dtype == "int8":
        assert sent.dtype == torch.int8 and math.isclose(scale, float(values.abs().max()) / 127)
        assert float((got - values).abs().max()) <= scale / 2 * (1 + 1e-5)
        assert int(sent.abs().max()) == 127  # the largest magnitude uses the whole range
    else:
        assert sent.dtype == torch.float16 and scale == 0.0
        assert bool(((got - values).abs() <= values.abs() * 2**-11 + 2**-24).all())


def test_only_wider_floating_tensors_are_narrowed() -> None:
    assert encoding(torch.float32, "float16") == torch.float16 and encoding(torch.float64, "int8") == torch.int8
    assert encoding(torch.float16, "float16") is None and encoding(torch.bfloat16, "float16") is None
    assert encoding(torch.bfloat16, "int8") == torch.int8
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
        assert encoding(dtype, "int8") is None and encoding(dtype, "float16") is None
    assert encoding(torch.float32, EXACT) is None


def test_float16_saturates_and_int8_of_zeros_or_non_finite_values() -> None:
    big = torch.tensor([1e6, -1e6, 3.0])
    assert decode(*encode(big, "float16"), torch.float32).tolist() == [65504.0, -65504.0, 3.0]
    zeros, scale = encode(torch.zeros(5), "int8")
    assert scale == 1.0 and zeros.tolist() == [0] * 5
    with pytest.raises(ValueError, match="NaN"):
        encode(torch.tensor([1.0, math.nan]), "int8")


@pytest.mark.parametrize("wire_dtype", LOSSY)
def test_a_lossy_transfer_round_trips_to_what_through_gives(wire_dtype: str) -> None:
    """The codec and the simulator's networks deliver the same values, bit for bit; integers stay exact."""
    msg = make_msg()
    frames = frames_of(msg, 100, wire_dtype=wire_dtype)
    header = frames[0].header
    assert header.total_size == payload_bytes(msg, wire_dtype) < msg.nbytes
    encodings = {e.name: (e.encoding, e.scale) for e in header.manifest}
    assert encodings["i32"] == ("", 0.0) and encodings["mask"] == ("", 0.0)
    assert encodings["conv.weight"][0] == wire_dtype and (encodings["conv.weight"][1] > 0) == (wire_dtype == "int8")
    _, got = feed_all(assembler(wire_dtype=wire_dtype), frames)
    want = through(msg, wire_dtype)
    for g, w, original in zip(got.parts, want.parts, msg.parts):
        assert g.values.dtype == original.values.dtype and torch.equal(g.values, w.values), g.name


def test_the_payload_shrinks_to_a_half_and_a_quarter() -> None:
    msg = ModelMessage("n", 0, "m", 1, parts_from_state({"w": torch.randn(1000, 100)}))
    sizes = {wd: frames_of(msg, wire_dtype=wd)[0].header.total_size for wd in (EXACT, *LOSSY)}
    assert sizes == {EXACT: 400_000, "float16": 200_000, "int8": 100_000}
    assert wire_size(msg, "int8") - wire_size(msg) == 100_000 - 400_000


@pytest.mark.parametrize(("sent", "receiver"), [(EXACT, "int8"), ("int8", EXACT), ("float16", "int8"),
                                                ("int8", "float16")])
def test_a_receiver_takes_only_what_its_own_wire_dtype_sends(sent: str, receiver: str) -> None:
    assert reason(frames_of(make_msg(), wire_dtype=sent)[:1], wire_dtype=receiver) == "wire_dtype_mismatch"


@pytest.mark.parametrize("scale", [0.0, -0.5, math.nan, math.inf, 1e300, 3.4e38 / 100])
def test_an_int8_scale_must_be_finite_and_positive_in_the_models_dtype(scale: float) -> None:
    frames = frames_of(make_msg(), wire_dtype="int8")
    frames[0].header.manifest[0].scale = scale
    assert reason(frames[:1], wire_dtype="int8") == "bad_scale"


def test_a_scale_on_an_entry_that_is_not_int8_is_refused() -> None:
    frames = frames_of(make_msg(), wire_dtype="float16")
    frames[0].header.manifest[0].scale = 0.5
    assert reason(frames[:1], wire_dtype="float16") == "bad_scale"


def test_a_lossy_payload_is_bounded_by_what_it_decodes_to() -> None:
    """4 bytes a value once decoded: an int8 payload under the limit is refused if its values are not."""
    state = {"w": torch.randn(1000)}
    frames = frames_of(make_msg(state), wire_dtype="int8")
    assert frames[0].header.total_size == 1000
    assert reason(frames[:1], state=state, wire_dtype="int8", limits=Limits(max_total_bytes=2000)) == "too_large"
    feed_all(assembler(state, wire_dtype="int8", limits=Limits(max_total_bytes=4000)), frames)


async def test_a_node_with_a_lossy_wire_takes_a_lossy_push(fleet_shards: Path, tmp_path: Path) -> None:
    """End to end over gRPC: a sender and a node (``--wire-dtype int8``) that both send int8; the node fuses what
    it decoded."""
    async with targeted(fleet_shards, tmp_path, wire_dtype="int8") as target:
        int8 = target.node.network.wire  # type: ignore[attr-defined]  # a daemon's: gRPC
        assert int8.wire_dtype == "int8"
        client = PeerClient(f"127.0.0.1:{target.node.config.network.grpc_port}", int8)
        try:
            await target.expect()
            _, sent, _ = await client.push(target.message(), 0, timeout=10)
        finally:
            await client.close()
        await target.node.roles.settled()
        assert target.node.tally.counters["fusions"] == 1 and (await target.rejected()) == {}
        assert sent < target.message().nbytes / 3  # int8: a quarter of the floats, plus the header


def test_a_simulation_on_an_int8_wire_runs_and_sends_a_quarter() -> None:
    config = ExperimentConfig(nodes=4, rounds=2, eval_every=2, hidden=[256], seed=1, algorithms=["fullavg"])
    exact = run_fleet(config, "fullavg")
    lossy_config = config.model_copy(update={"wire_dtype": "int8"})
    lossy = run_fleet(lossy_config, "fullavg")
    # a quarter of the payload, plus each message's headers (counted as the daemon counts them)
    assert 0.25 < lossy.history[-1].bytes_transmitted / exact.history[-1].bytes_transmitted < 0.26
    assert lossy.history[-1].bytes_transmitted == lossy.bytes_transmitted
    assert [n.param_sha256 for n in lossy.nodes] != [n.param_sha256 for n in exact.nodes]
