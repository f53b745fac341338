"""The trained model put to use over REST (``GET /model``, ``/model/info``, ``POST /predict``), on real nodes.

* A fleet of two real nodes (real gRPC, the REST API on a real port, in one process) learns for a few rounds;
  ``/predict`` then answers, for every sample of the global test set, the class the node's own model gives in
  this process, and ``/model``'s file rebuilds that very model (same digest) from the spec in its metadata.
* What is served is the *committed* model: one that a role is changing is not served until it is checkpointed.
* Malformed requests get 422 (a body too large, 413) with one line saying what is wrong, and change nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import torch

from dfl_node.algorithms import Role
from dfl_node.api.app import create_app
from dfl_node.api.serving import MAX_BATCH, MAX_BODY
from dfl_node.learning.datasets import load_shard
from dfl_node.learning.export import TrainedModel
from dfl_node.learning.models import param_digest
from dfl_node.node.node import Node
from dfl_node.service.run import _listen, run_node
from dfl_node.service.wiring import Daemon
from dfl_node.settings.node import NodeConfig
from dfl_node.testbed.launcher import free_port
from tests.helpers.fleet import fleet_node_config

ROUNDS = 6


def config(shards: Path, state: Path, node_id: str, **changes: object) -> NodeConfig:
    settings = dict(id=node_id, data=shards / node_id, grpc_port=free_port(), http_port=free_port(), mdns=False,
                    state_dir=state / node_id, evaluate=False, heartbeat=0.2, token_timeout=1.0, rounds=0)
    return fleet_node_config(**{**settings, **changes})


async def test_predict_answers_what_the_trained_model_gives_in_process(fleet_shards: Path, tmp_path: Path) -> None:
    swarm = f"serve-{uuid.uuid4().hex[:6]}"
    first, second = (config(fleet_shards, tmp_path, f"node-{i}", swarm=swarm, rounds=ROUNDS,
                                     local_epochs=10, mkt_epochs=5)  # a few rounds that learn
                     for i in range(2))
    daemons = [Daemon.build(first.model_copy(update={"peers": [second.network.address]})),
               Daemon.build(second.model_copy(update={"peers": [first.network.address]}))]
    nodes = [d.node for d in daemons]
    w0 = nodes[0].learner.digest  # both start from the same w0
    stops = [asyncio.Event() for _ in nodes]
    tasks = [asyncio.create_task(run_node(d, stop)) for d, stop in zip(daemons, stops)]
    try:
        await asyncio.wait_for(asyncio.gather(*(n.scheduler.finished.wait() for n in nodes)), 120)
        node = max(nodes, key=lambda n: n.tally.counters["fusions"])  # Def-KT: a receiver's model is the fused one
        await node.roles.quiesce()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.config.api.http_port}", timeout=30) as client:
            info = (await client.get("/model/info")).json()
            status = (await client.get("/status")).json()
            model_file = await client.get("/model")
            test = load_shard(fleet_shards / "test.safetensors")
            answers = []
            for start in range(0, len(test), 100):
                reply = await client.post("/predict", json={"samples": test.x[start : start + 100].tolist()})
                assert reply.status_code == 200, reply.text
                answers += reply.json()["predictions"]
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)
    assert node.progress.round == ROUNDS and node.learner.digest != w0  # it learned: its model is not w0
    assert info["sha256"] == status["param_sha256"] == node.learner.digest
    assert (info["spec"], info["sample_shape"], info["num_classes"], info["node"]) == ("mlp:32,32", [1, 8, 8], 10,
                                                                                        node.node_id)
    with torch.no_grad():
        logits = node.learner.ctx.model.eval()(test.x)
    expected = logits.argmax(1).tolist()
    assert [a["class"] for a in answers] == expected
    probabilities = torch.tensor([a["probabilities"] for a in answers])
    assert torch.allclose(probabilities, torch.softmax(logits, 1), atol=1e-6)
    assert [a["probability"] for a in answers] == probabilities.max(1).values.tolist()
    accuracy = sum(c == y for c, y in zip(expected, test.y.tolist())) / len(test)
    assert accuracy > 0.7  # a trained model (0.85 here): chance is 0.1

    served = TrainedModel.from_bytes(model_file.content)  # the file alone: its card rebuilds the architecture
    assert served.card.spec == "mlp:32,32" and served.card.round == ROUNDS
    rebuilt = served.module
    assert param_digest(rebuilt.state_dict()) == node.learner.digest
    assert torch.equal(rebuilt(test.x).argmax(1), logits.argmax(1))
    assert model_file.headers["content-disposition"] == \
        f'attachment; filename="{node.node_id}-round{ROUNDS}.safetensors"'


@pytest.fixture
async def serving_node(fleet_shards: Path, tmp_path: Path) -> AsyncIterator[tuple[Node, httpx.AsyncClient]]:
    """A real node (not started: no scheduler changes its model behind the test's back) and a client of its
    REST app."""
    node = Daemon.build(config(fleet_shards, tmp_path, "node-0")).node
    await node.start()  # its first checkpoint: w0
    app = create_app(node)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
            yield node, client
    finally:
        node.learner.checkpoint.lock.release()


async def test_a_model_being_changed_is_served_only_once_checkpointed(
        serving_node: tuple[Node, httpx.AsyncClient]) -> None:
    node, client = serving_node
    committed = node.learner.digest
    samples = node.learner.ctx.val.x[:8]
    assert node.learner.served.committed is None  # a node nobody asked keeps no copy of its model
    before = (await client.post("/predict", json={"samples": samples.tolist()})).json()
    assert node.learner.served.committed is not None  # read from its checkpoint, kept from now on
    node.roles.take(Role.AGGREGATOR)  # as a role does before it trains or fuses in a worker thread
    with torch.no_grad():
        for parameter in node.learner.ctx.model.parameters():
            parameter.mul_(-3.0)  # the model, half-way through its change
    changed = param_digest(node.learner.ctx.model.state_dict())
    during = (await client.post("/predict", json={"samples": samples.tolist()})).json()
    assert during == before and during["sha256"] == committed
    assert (await client.get("/model/info")).json()["sha256"] == committed
    assert param_digest(TrainedModel.from_bytes((await client.get("/model")).content).module.state_dict()) == committed
    await node.learner.changed("fusion", 1, "node-1")  # the role's end: evaluated, checkpointed
    node.roles.release()
    after = (await client.post("/predict", json={"samples": samples.tolist()})).json()
    assert after["sha256"] == changed == node.learner.digest and after["round"] == 0
    with torch.no_grad():
        assert [p["class"] for p in after["predictions"]] == node.learner.ctx.model(samples).argmax(1).tolist()


async def test_before_its_first_checkpoint_a_node_serves_no_model(fleet_shards: Path, tmp_path: Path) -> None:
    node = Daemon.build(config(fleet_shards, tmp_path, "node-0")).node
    app = create_app(node)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as client:
            for reply in (await client.get("/model"), await client.post("/predict", content=body([SAMPLE]))):
                assert reply.status_code == 503
                assert reply.json()["detail"] == "the node has not checkpointed a model yet (it is starting)"
            await node.start()  # what a node does once it serves: its first checkpoint, w0
            assert (await client.post("/predict", content=body([SAMPLE]))).status_code == 200
    finally:
        node.learner.checkpoint.lock.release()


def body(samples: object) -> bytes:
    return json.dumps({"samples": samples}).encode()


ROW = [0.5] * 8
SAMPLE = [[ROW] * 8]  # one sample of the digits' shape (1, 8, 8)


def one(row: list, at: int = 7) -> bytes:
    """A batch of one sample whose row ``at`` is ``row``."""
    return body([[[ROW] * at + [row] + [ROW] * (7 - at)]])


MALFORMED = {
    "wrong shape": (body([[0.5] * 64]), "samples[0][0]: Input should be a valid array"),
    "a short row": (one([0.5] * 7), "samples[0][0][7]: List should have at least 8 items"),
    "a long row": (one([0.5] * 9), "samples[0][0][7]: List should have at most 8 items"),
    "NaN": (one([0.5] * 7 + [float("nan")]), "samples[0][0][7][7]: Input should be a finite number"),
    "infinity": (one([float("-inf")] + [0.5] * 7, at=0), "samples[0][0][0][0]: Input should be a finite number"),
    "beyond float32": (one([1e39] * 8), "samples[0]: a value beyond float32's range"),
    "a string": (one(["0.5"] * 8), "samples[0][0][7][0]: Input should be a valid number"),
    "a boolean": (one([True] * 8), "samples[0][0][7][0]: Input should be a valid number"),
    "null": (one([None] * 8), "samples[0][0][7][0]: Input should be a valid number"),
    "too many samples": (body([SAMPLE] * (MAX_BATCH + 1)), f"samples: List should have at most {MAX_BATCH} items"),
    "no samples": (body([]), "samples: List should have at least 1 item"),
    "an empty body": (b"", "the body is empty"),
    "not JSON": (b"samples=1", "the body is not JSON"),
    "another key": (json.dumps({"samples": [SAMPLE], "model": "mine"}).encode(), "model: Extra inputs are not"),
    "not an object": (json.dumps([SAMPLE]).encode(), "body: Input should be an object"),
}


def weights(reply: httpx.Response) -> tuple[object, dict[str, torch.Tensor]]:
    """``/model``'s card and weights (its bytes are not: safetensors writes its metadata in any order)."""
    model = TrainedModel.from_bytes(reply.content)
    return model.card, model.state


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_request_is_422_and_changes_nothing(serving_node: tuple[Node, httpx.AsyncClient],
                                                              case: str) -> None:
    node, client = serving_node
    content, reason = MALFORMED[case]
    status, (card, state) = (await client.get("/status")).json(), weights(await client.get("/model"))
    reply = await client.post("/predict", content=content, headers={"content-type": "application/json"})
    assert reply.status_code == 422, reply.text
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and detail.startswith(reason), detail
    assert detail.endswith("each of shape [1, 8, 8], of finite numbers")  # and what it takes
    after = (await client.get("/status")).json()
    assert {k: v for k, v in after.items() if k != "uptime_s"} == {k: v for k, v in status.items() if k != "uptime_s"}
    after_card, after_state = weights(await client.get("/model"))
    assert after_card == card and all(torch.equal(state[k], after_state[k]) for k in state)
    assert (await client.post("/predict", content=body([SAMPLE]))).status_code == 200  # and it still answers
    metrics = (await client.get("/metrics")).text
    assert 'dfl_predict_requests_total{node="node-0",outcome="invalid"} 1.0' in metrics
    assert 'dfl_predict_requests_total{node="node-0",outcome="ok"} 1.0' in metrics
    assert 'dfl_predicted_samples_total{node="node-0"} 1.0' in metrics
    assert 'dfl_predict_duration_seconds_count{node="node-0"} 1.0' in metrics


async def test_a_body_too_large_is_413_unread(serving_node: tuple[Node, httpx.AsyncClient]) -> None:
    node, client = serving_node
    digest = node.learner.digest
    announced = await client.post("/predict", content=b" " * (MAX_BODY + 1))
    assert announced.status_code == 413 and announced.json()["detail"] == (f"the body has {MAX_BODY + 1} bytes; at "
                                                                            f"most {MAX_BODY}")

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it streams in
        for _ in range(MAX_BODY // 2**20 + 1):
            yield b" " * 2**20

    streamed = await client.post("/predict", content=chunks())
    assert streamed.status_code == 413 and streamed.json()["detail"] == f"the body exceeds {MAX_BODY} bytes"
    assert node.learner.digest == digest and node.tally.counters == {}
    assert 'outcome="too_large"} 2.0' in (await client.get("/metrics")).text


def test_the_rest_apis_connections_send_at_once() -> None:
    """Every answer of the REST API, /predict's included, is headers then a body: a connection with Nagle's
    algorithm held the body back until the client's delayed ACK, 44 ms a request. The node's listening socket
    passes TCP_NODELAY on to every connection it accepts."""
    with _listen("127.0.0.1", 0) as listener, socket.create_connection(listener.getsockname()[:2]):
        listener.setblocking(True)
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
