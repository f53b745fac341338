"""Protocol v2: group plans, decentralized FedAvg/FedProx (003 Alg. 2, eq. 5), architecture specs."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from dfl_node.algorithms import AlgorithmError, Group, NodeContext, NodeProfile, Step, make_algorithm
from dfl_node.algorithms.base import sample_gather, senders_for
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import average_states
from dfl_node.learning.models import ModelSpec, spread
from dfl_node.learning.provision import architectures
from dfl_node.learning.training import SgdParams, local_sgd, minibatches
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim import run_fleet

CONFIG = SharedSettings(batch_size=8, lr=0.1, momentum=0.0)


def _node(node_id: str, spec: str, samples: int, seed: int) -> NodeContext:
    g = torch.Generator().manual_seed(seed)
    data = ArrayDataset(torch.randn(samples + 4, 1, 8, 8, generator=g),
                        torch.randint(0, 10, (samples + 4,), generator=g), 10)
    parsed = ModelSpec.parse(spec)
    model = parsed.build((1, 8, 8), 10, seed=seed)
    return NodeContext(node_id, model, parsed, data.subset(range(samples)), data.subset(range(samples, samples + 4)),
                       CONFIG)


def _vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in model.state_dict().values()])


def test_gather_plan_one_aggregator_and_a_share_of_senders() -> None:
    ids = [f"n{i}" for i in range(4)]
    group = sample_gather(0, 3, ids, 0.5)
    assert len(group.senders) == 2 and group.aggregator not in group.senders
    assert list(group.senders) == sorted(group.senders)
    assert group == sample_gather(0, 3, list(reversed(ids)), 0.5)
    assert {sample_gather(0, t, ids, 0.5).aggregator for t in range(20)} == set(ids)  # the role moves around
    assert [senders_for(n, 0.5) for n in (2, 4, 10, 50)] == [1, 2, 5, 25]  # 003: 5 of 10, 25 of 50
    plan = make_algorithm("fedavg", CONFIG).plan_round(3, [NodeProfile(i, "mlp", 10) for i in ids], {})
    assert plan.groups == (group,)


def test_average_states_is_eq5_by_hand() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(7)}
    b = {"w": torch.tensor([4.0, 8.0]), "steps": torch.tensor(9)}
    avg = average_states([a, b], [1, 2])  # (1·a + 2·b) / 3
    assert torch.allclose(avg["w"], torch.tensor([3.0, 6.0])) and avg["steps"].item() == 7
    with pytest.raises(ValueError, match="different architectures"):
        average_states([a, {"w": torch.zeros(3), "steps": torch.tensor(1)}], [1, 1])


def test_fedavg_averages_each_architecture_cluster_and_answers_each_sender() -> None:
    algo = make_algorithm("fedavg", CONFIG)
    agg, same, other = _node("a", "mlp:16", 10, 1), _node("b", "mlp:16", 30, 2), _node("c", "mlp:8,8", 20, 3)
    step = Step(0, Group("a", ("b", "c")))
    algo.local_step(agg, step)
    messages = [algo.transmit(same, step), algo.transmit(other, step)]
    trained = {n.node_id: _vector(n.model).clone() for n in (agg, same, other)}
    replies = algo.aggregate(agg, step, messages)
    expected = (10 * trained["a"] + 30 * trained["b"]) / 40  # eq. 5 over the mlp:16 cluster, sample counts
    assert torch.allclose(_vector(agg.model), expected, atol=1e-6)
    for sender in (same, other):
        algo.finish(sender, step, replies[sender.node_id])
    assert torch.equal(_vector(same.model), _vector(agg.model))
    assert torch.equal(_vector(other.model), trained["c"])  # alone in its cluster: its own model comes back
    with pytest.raises(AlgorithmError, match="not of mlp:16"):
        algo.finish(same, step, replies["c"])


def test_fedavg_refuses_a_model_its_registry_does_not_build() -> None:
    algo = make_algorithm("fedavg", CONFIG)
    agg, sender = _node("a", "mlp:16", 10, 1), _node("b", "mlp:16", 10, 2)
    message = algo.transmit(sender, Step(0, Group("a", ("b",))))
    for forged in (replace(message, model="mlp:17"), replace(message, model="resnet:1"),
                   replace(message, parts=message.parts[:-1])):
        with pytest.raises(AlgorithmError):
            algo.check_message(agg, forged)


def test_fedprox_local_update_is_sgd_on_the_loss_plus_the_proximal_term() -> None:
    node, mu = _node("a", "mlp:16", 32, 5), 0.5
    params = SgdParams(lr=0.1, momentum=0.0, batch_size=8, epochs=2)
    reference = copy.deepcopy(node.model)
    anchor = [p.detach().clone() for p in reference.parameters()]
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(9)  # shared across the epochs, as in local_sgd
    for _ in range(2):
        for idx in minibatches(32, 8, generator):
            optimizer.zero_grad()
            penalty = sum(((p - a) ** 2).sum() for p, a in zip(reference.parameters(), anchor))
            (F.cross_entropy(reference(node.train.x[idx]), node.train.y[idx]) + mu / 2 * penalty).backward()
            optimizer.step()
    local_sgd(node.model, node.train, params, torch.Generator().manual_seed(9), proximal_mu=mu)
    assert torch.allclose(_vector(node.model), _vector(reference), atol=1e-6)
    plain = _node("a", "mlp:16", 32, 5)
    local_sgd(plain.model, plain.train, params, torch.Generator().manual_seed(9))
    assert not torch.allclose(_vector(plain.model), _vector(reference), atol=1e-4)  # μ matters


def test_model_specs_and_the_cnn_family_of_003() -> None:
    assert str(ModelSpec.parse("cnn-ln:32,64")) == "cnn-ln:32,64" and str(ModelSpec.parse("mlp")) == "mlp"
    with pytest.raises(ValueError, match="unknown model spec"):
        ModelSpec.parse("resnet18")
    with pytest.raises(ValueError, match="pool"):
        ModelSpec.parse("cnn-ln:8,16,32,64,128").build((1, 28, 28), 10, device="meta")
    for widths in ((32, 64), (16, 32), (32, 64, 128), (8, 16, 32, 64), (32, 64, 128, 256)):
        model = ModelSpec("cnn-ln", widths).build((1, 28, 28), 10)
        assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
        assert sum(isinstance(m, torch.nn.LayerNorm) for m in model) == len(widths)
    assert spread(["x", "y"], ["n0", "n1", "n2"]) == {"n0": "x", "n1": "y", "n2": "x"}


def test_a_mixed_fleet_learns_with_fedavg_per_cluster_in_the_simulator() -> None:
    config = ExperimentConfig(nodes=4, rounds=12, eval_every=12, batch_size=20, lr=0.05,
                              architectures=["mlp:32,32", "mlp:16"], algorithms=["fedavg"])
    specs = architectures(config.architectures, config.learning, config.nodes)
    assert [str(s) for s in specs.values()] == ["mlp:32,32", "mlp:16", "mlp:32,32", "mlp:16"]
    result = run_fleet(config, "fedavg")
    assert result.history[-1].global_accuracy > result.history[0].global_accuracy + 0.2
    assert result.models_transmitted == 12 * 2  # 2 senders (50 % of 4) each round


def test_a_mixed_fleet_with_an_algorithm_that_needs_identical_models_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="defkt fuse identical architectures only"):
        ExperimentConfig(architectures=["mlp:16", "mlp:32"], algorithms=["defkt", "fedavg"])
    assert ExperimentConfig(architectures=["mlp:16", "mlp:16"], algorithms=["defkt"])  # one architecture is fine
