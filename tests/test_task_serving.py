"""What a node of another task than classification shows and serves: a regression fleet and an anomaly
fleet of two real nodes each (real gRPC, the REST API on a real port, in this process) learn for a few rounds;
then every place that shows a figure names the task's metric (``/status``, ``/metrics``, ``dfl-node status``, the
run's last log line), ``/predict`` answers what the node's own model gives in this process (a regressor's values;
an anomaly detector's scores, flagging injected anomalies and not normal samples), and the ONNX export, run by
onnxruntime, answers what ``/predict`` answers. Classification's outputs are pinned by the older tests."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import pytest
import torch
from rich.console import Console

from dfl_node.api.status_cli import show_status
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.tasks import Anomaly
from dfl_node.node.node import Node
from dfl_node.records.formatting import figure
from dfl_node.records.metrics import figure_metric
from dfl_node.service.wiring import Daemon
from dfl_node.testbed.launcher import free_port
from tests.helpers.cli import invoke
from tests.helpers.nodes import quiet_node_config, running

FEATURES, TARGETS, ROUNDS = 6, 2, 4


def regression_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """y = W x + b (+ a little noise), the same W for every device."""
    weights = np.random.default_rng(99)
    w, b = weights.normal(size=(FEATURES, TARGETS)), weights.normal(size=TARGETS)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES))
    return x.astype(np.float32), (x @ w + b + 0.05 * rng.normal(size=(n, TARGETS))).astype(np.float32)


BASIS = np.random.default_rng(7).normal(size=(2, 8))  # normal samples lie on this plane of an 8-D space


def normal_samples(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 2)) @ BASIS + 0.01 * rng.normal(size=(n, 8))).astype(np.float32)


def anomalies(seed: int, n: int) -> np.ndarray:
    """Obvious anomalies: far off the plane, in every direction."""
    return (5 * np.random.default_rng(seed).normal(size=(n, 8))).astype(np.float32)


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, task: str, data: list[tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, ...],
                **settings: object) -> AsyncIterator[list[Node]]:
    """Two nodes of ``task`` on ``data`` (an NPZ file each) and the global test set ``test``, peers of each other,
    that play :data:`ROUNDS` rounds: yielded once both are done, stopped on the way out."""
    np.savez(tmp_path / "test.npz", x=test[0], y=test[1])
    ports = [free_port() for _ in data]
    configs = []
    for i, (x, y) in enumerate(data):
        folder = tmp_path / f"node-{i}"
        folder.mkdir()
        np.savez(folder / "readings.npz", x=x, y=y)
        configs.append(quiet_node_config(tmp_path, tmp_path / "state" / f"node-{i}", id=f"node-{i}", data=folder,
                                         test_data=tmp_path / "test.npz", task=task, grpc_port=ports[i],
                                         http_port=free_port(), peers=[f"127.0.0.1:{ports[1 - i]}"], rounds=ROUNDS,
                                         evaluate=True, **settings))
    async with running(configs[0]) as first, running(configs[1]) as second:
        nodes = [first, second]
        await asyncio.wait_for(asyncio.gather(*(n.scheduler.finished.wait() for n in nodes)), 60)
        for node in nodes:
            await node.roles.quiesce()
        yield nodes


def client(node: Node) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.config.api.http_port}", timeout=30)


def gauges(metrics: str, node: str) -> dict[str, float]:
    """The ``dfl_local_*`` and ``dfl_global_*`` samples of ``node`` in an exposition text, by metric name."""
    return {m[1]: float(m[2]) for m in re.finditer(rf'^(dfl_(?:local|global)_\w+){{node="{node}"}} (\S+)$', metrics,
                                                     re.MULTILINE)}


def status_text(node: Node, *, all_peers: bool = False) -> str:
    """``dfl-node status`` (``--all --wide``) of ``node``, as printed."""
    out = io.StringIO()
    code = show_status(f"127.0.0.1:{node.config.api.http_port}", all_peers=all_peers, wide=all_peers,
                       console=Console(file=out, width=200))
    assert code == 0
    return out.getvalue()


async def predict_cli(node: Node, samples: np.ndarray, tmp_path: Path) -> list[str]:
    """``dfl-node predict samples.npz --url …``'s lines (a blocking client, of a node on this loop)."""
    np.savez(tmp_path / "samples.npz", x=samples)
    url = f"http://127.0.0.1:{node.config.api.http_port}"
    result = await asyncio.to_thread(invoke, "predict", str(tmp_path / "samples.npz"), "--url", url)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def onnx_answers(node: Node, out: Path, x: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
    """``dfl-node export`` of ``node``'s state folder as ONNX, run by onnxruntime on ``x``: its one output, and
    its card."""
    result = invoke("export", str(node.config.state_path), "--out", str(out))
    assert result.exit_code == 0, result.output
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    [output] = session.get_outputs()
    return session.run([output.name], {"samples": x})[0], session.get_modelmeta().custom_metadata_map


async def test_a_regression_node_names_its_rmse_and_answers_values(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dfl_node.node.node")
    test_x, test_y = regression_data(100, 200)
    async with fleet(tmp_path, "regression", [regression_data(i, 150) for i in range(2)], (test_x, test_y),
                     hidden=[16], local_epochs=10, mkt_epochs=5, lr=0.02) as nodes:
        node = max(nodes, key=lambda n: n.tally.counters["fusions"])  # Def-KT: a receiver's model is the fused one
        async with client(node) as http:
            status = (await http.get("/status")).json()
            metrics = (await http.get("/metrics")).text
            info = (await http.get("/model/info")).json()
            reply = await http.post("/predict", json={"samples": test_x[:50].tolist()})
            bad = await http.post("/predict", json={"samples": [[1.0, 2.0]]})
            again = await http.post("/predict", json={"samples": test_x[:1].tolist()})
        shown = await asyncio.to_thread(status_text, node)  # a blocking client, of a node on this loop
        fleet_shown = await asyncio.to_thread(status_text, node, all_peers=True)
        printed = await predict_cli(node, test_x[:3], tmp_path)
        model = node.learner.ctx.model.eval()
        with torch.no_grad():
            expected = model(torch.from_numpy(test_x)).double()
        rmse = float((expected - torch.from_numpy(test_y).double()).square().mean().sqrt())
        onnx, card = onnx_answers(node, tmp_path / "model.onnx", test_x[:50])

    local, global_ = node.learner.accuracy
    assert (status["task"], status["metric"]) == ("regression", "rmse")
    assert (status["local_accuracy"], status["global_accuracy"]) == (local, global_)
    assert global_ == pytest.approx(rmse, rel=1e-6)
    assert global_ < 0.5 * float(test_y.std(0).mean())  # it learned: far better than the targets' mean
    assert gauges(metrics, node.node_id) == {"dfl_local_rmse": local, "dfl_global_rmse": global_}
    assert "# HELP dfl_global_rmse RMSE of the node's model on the global test set." in metrics
    assert f"global rmse  {global_:.4g}" in re.sub(r" *│ *", "  ", shown) and "regression" in shown
    assert "global rmse" in fleet_shown and f"{global_:.4g}" in fleet_shown
    summary = [m for r in caplog.records if (m := r.getMessage()).startswith(f"{node.node_id}: done after")]
    assert summary and summary[-1].endswith(f"rmse local {local:.4g}, global {global_:.4g}")

    assert (info["task"], info["num_classes"], info["threshold"]) == ("regression", TARGETS, None)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["sha256"] == info["sha256"] == status["param_sha256"]
    values = torch.tensor([p["values"] for p in answer["predictions"]], dtype=torch.float64)
    assert all(p.keys() == {"values"} for p in answer["predictions"])
    torch.testing.assert_close(values, expected[:50], rtol=1e-6, atol=1e-6)
    assert bad.status_code == 422 and "each of shape [6]" in bad.json()["detail"]
    assert again.status_code == 200  # a bad request changes nothing: the node keeps serving
    assert printed == [" ".join(f"{v:.6g}" for v in p["values"]) for p in answer["predictions"][:3]]

    assert (card["task"], card["sha256"], "threshold" in card) == ("regression", info["sha256"], False)
    assert onnx.shape == (50, TARGETS)
    torch.testing.assert_close(torch.from_numpy(onnx).double(), values, rtol=1e-5, atol=1e-5)


# An autoencoder of the user's own, named as package.module:factory (every way of naming a model serves
# and exports for every task): a bottleneck of 4 over the sample's values, the factory's "classes" its outputs
USER_AUTOENCODER = """
import math

from torch import nn


def autoencoder(sample_shape, outputs):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(sample_shape), 4), nn.ReLU(), nn.Linear(4, outputs))
"""


async def test_an_anomaly_node_names_its_auc_and_flags_anomalies(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "task_user_models.py").write_text(USER_AUTOENCODER)
    monkeypatch.syspath_prepend(str(tmp_path))
    normal = [normal_samples(i, 200) for i in range(2)]
    data = [(x, np.zeros(len(x), np.int64)) for x in normal]  # a device's readings: normal, as far as it knows
    test_x = np.concatenate([normal_samples(50, 100), anomalies(51, 20)])
    test_flags = np.array([0] * 100 + [1] * 20, np.int64)
    async with fleet(tmp_path, "anomaly", data, (test_x, test_flags), model="task_user_models:autoencoder",
                     hidden=None, local_epochs=30, mkt_epochs=5, anomaly_quantile=0.99) as nodes:
        node = max(nodes, key=lambda n: n.tally.counters["fusions"])
        held_out, injected = normal_samples(60, 100), anomalies(61, 10)
        samples = np.concatenate([held_out, injected])
        async with client(node) as http:
            status = (await http.get("/status")).json()
            metrics = (await http.get("/metrics")).text
            info = (await http.get("/model/info")).json()
            reply = await http.post("/predict", json={"samples": samples.tolist()})
            bad = await http.post("/predict", content='{"samples": [[NaN, 0, 0, 0, 0, 0, 0, 0]]}',
                                  headers={"content-type": "application/json"})
            again = await http.post("/predict", json={"samples": samples[:1].tolist()})
        shown = await asyncio.to_thread(status_text, node)
        printed = await predict_cli(node, samples[98:102], tmp_path)
        task, ctx = node.learner.ctx.task, node.learner.ctx
        assert isinstance(task, Anomaly)
        model = ctx.model
        threshold = task.threshold(model, ctx.val)
        scores = task.scores(model, ArrayDataset(torch.from_numpy(samples), torch.zeros(len(samples)).long(), 2))
        onnx, card = onnx_answers(node, tmp_path / "model.onnx", samples)

    local, global_ = node.learner.accuracy
    assert (status["task"], status["metric"]) == ("anomaly", "auc")
    assert (status["local_accuracy"], status["global_accuracy"]) == (local, global_)
    assert global_ > 0.95  # the test set's anomalies rank above its normal samples
    assert gauges(metrics, node.node_id) == {"dfl_local_auc_ratio": local, "dfl_global_auc_ratio": global_}
    assert f"global auc  {global_:.4g}" in re.sub(r" *│ *", "  ", shown) and "anomaly" in shown

    assert (info["task"], info["num_classes"]) == ("anomaly", 8)
    assert info["threshold"] == pytest.approx(threshold, rel=1e-9)  # the committed model's, on the node's val
    assert reply.status_code == 200, reply.text
    answer = reply.json()["predictions"]
    assert all(p.keys() == {"score", "flag"} for p in answer)
    torch.testing.assert_close(torch.tensor([p["score"] for p in answer], dtype=torch.float64), scores,
                               rtol=1e-6, atol=1e-9)
    flags = [p["flag"] for p in answer]
    assert flags == [p["score"] > info["threshold"] for p in answer]
    assert all(flags[100:])  # every injected anomaly
    assert sum(flags[:100]) <= 5  # normal samples, held out: about 1 % lie above the validation's 99th percentile
    assert bad.status_code == 422 and again.status_code == 200
    assert printed == [f"{p['score']:.4g} {'anomaly' if p['flag'] else 'normal'}" for p in answer[98:102]]
    assert [line.split()[1] for line in printed[2:]] == ["anomaly", "anomaly"]

    assert (card["task"], float(card["threshold"]), card["sha256"]) == ("anomaly", info["threshold"], info["sha256"])
    assert onnx.shape == (len(samples),)
    torch.testing.assert_close(torch.from_numpy(onnx), torch.tensor([p["score"] for p in answer],
                                                                    dtype=torch.float64), rtol=1e-5, atol=1e-9)
    assert (onnx > float(card["threshold"])).tolist() == flags

    resumed = Daemon.build(node.config).node  # restarted: its first request's model is its last checkpoint's
    try:
        committed = await resumed.committed_model()
    finally:
        resumed.learner.checkpoint.lock.release()
    assert committed is not None and committed.card.sha256 == card["sha256"]
    assert committed.card.threshold == pytest.approx(float(card["threshold"]), rel=1e-9)  # recomputed, the same


def test_a_figure_is_named_by_its_metric_and_classification_reads_as_it_did() -> None:
    accuracy = figure(None)  # a node older than tasks
    assert accuracy == figure("accuracy") and accuracy.format(0.9123) == "91.23%" and accuracy.short == "acc"
    assert [figure_metric(accuracy, scope) for scope in ("local", "global")] == ["dfl_local_accuracy_ratio",
                                                                                "dfl_global_accuracy_ratio"]
    assert figure_metric(figure("auc"), "global") == "dfl_global_auc_ratio"
    assert figure_metric(figure("rmse"), "local") == "dfl_local_rmse" and figure("rmse").format(0.41234) == "0.4123"
    plugin = figure("f1-score")
    assert figure_metric(plugin, "global") == "dfl_global_f1_score" and plugin.format(None) == "–"
    # a peer's word: an accuracy is a fraction, an RMSE any finite number
    assert accuracy.plausible(7.5) is None and figure("rmse").plausible(7.5) == 7.5
    assert figure("rmse").plausible(float("nan")) is None
