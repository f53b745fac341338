"""The papers' formulas, pinned against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import (
    average_parts_,
    mkt_losses,
    mutual_knowledge_transfer,
    segment_parts,
    segment_ranges,
    weighted_average_,
)
from dfl_node.learning.tensors import TensorPart
from dfl_node.learning.training import SgdParams


def test_eq9_weighted_average_by_hand() -> None:
    local = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.0, 10.0]), "n": torch.tensor(7)}
    remote = {"w": torch.tensor([[5.0, 6.0], [7.0, 8.0]]), "b": torch.tensor([4.0, 2.0]), "n": torch.tensor(99)}
    weighted_average_(local, remote, n_local=300, n_remote=100)  # weights 3/4 local, 1/4 remote
    assert torch.allclose(local["w"], torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    assert torch.allclose(local["b"], torch.tensor([1.0, 8.0]))
    assert int(local["n"]) == 7  # integer buffers are never averaged
    assert torch.equal(remote["w"], torch.tensor([[5.0, 6.0], [7.0, 8.0]]))  # the remote model untouched


def test_weighted_average_updates_a_models_parameters_in_place() -> None:
    model = nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    remote = {k: torch.ones_like(v) for k, v in before.items()}
    weighted_average_(model.state_dict(), remote, n_local=1, n_remote=1)
    for name, param in model.named_parameters():
        assert torch.allclose(param, (before[name] + 1) / 2) and param.requires_grad


def test_weighted_average_rejects_mismatched_models() -> None:
    with pytest.raises(ValueError):
        weighted_average_({"w": torch.zeros(2)}, {"v": torch.zeros(2)}, 1, 1)
    local = {"a": torch.zeros(2), "w": torch.zeros(2)}
    with pytest.raises(ValueError):
        weighted_average_(local, {"a": torch.ones(2), "w": torch.zeros(3)}, 1, 1)
    assert torch.equal(local["a"], torch.zeros(2))  # checked before anything changed


def test_segments_cover_the_flat_vector_once_and_evenly() -> None:
    state = {"a": torch.zeros(7, 3), "b": torch.zeros(5), "steps": torch.tensor(3), "c": torch.zeros(2, 2)}
    total = 21 + 5 + 4
    for count in (2, 3, 4, 7):
        segments = segment_ranges(state, count)
        sizes = [sum(stop - start for _, start, stop in seg) for seg in segments]
        assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
        covered = {(name, i) for seg in segments for name, start, stop in seg for i in range(start, stop)}
        assert len(covered) == total and not any(name == "steps" for name, _ in covered)


def test_average_parts_moves_exactly_the_declared_segment() -> None:
    local = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(4.0)}
    remote = {"a": torch.full((2, 3), 100.0), "b": torch.full((4,), 100.0)}
    parts = segment_parts(remote, [1], 2)  # second half of the 10 elements: a[5], b[0:4]
    assert [(p.name, p.start, p.values.numel()) for p in parts] == [("a", 5, 1), ("b", 0, 4)]
    average_parts_(local, parts, n_local=1, n_remote=1)
    assert torch.equal(local["a"].view(-1)[:5], torch.arange(5.0))  # first segment untouched
    assert local["a"].view(-1)[5] == (5.0 + 100.0) / 2
    assert torch.equal(local["b"], (torch.arange(4.0) + 100.0) / 2)


def test_average_parts_checks_every_part_before_changing_anything() -> None:
    local = {"a": torch.zeros(4), "b": torch.zeros(2)}
    parts = segment_parts({"a": torch.ones(4), "b": torch.ones(2)}, [0, 1], 2)
    too_long = parts[:-1] + (TensorPart("b", (2,), 1, torch.ones(2)),)
    with pytest.raises(ValueError, match="overruns"):
        average_parts_(local, too_long, n_local=1, n_remote=1)
    assert torch.equal(local["a"], torch.zeros(4))


class TinyLinear(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.weight.T


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_one_mkt_step_equals_hand_computed_gradient_step() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 3)).astype(np.float64)
    y = np.array([0, 2, 1, 2])
    w1, w2 = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    lr1, lr2 = 0.1, 0.05
    # By hand: d/dz1 [CE(p1, y) + KL(p2 || p1)] = (p1 - onehot) + (p1 - p2), averaged over the batch.
    p1, p2, onehot = _softmax(x @ w1.T), _softmax(x @ w2.T), np.eye(3)[y]
    w1_expected = w1 - lr1 * ((2 * p1 - onehot - p2).T @ x) / len(x)
    w2_expected = w2 - lr2 * ((2 * p2 - onehot - p1).T @ x) / len(x)

    received = TinyLinear(torch.tensor(w1, dtype=torch.float32))
    local = TinyLinear(torch.tensor(w2, dtype=torch.float32))
    data = ArrayDataset(torch.tensor(x, dtype=torch.float32).reshape(4, 1, 1, 3), torch.tensor(y), 3)
    one_batch = dict(momentum=0.5, batch_size=4, epochs=1)
    mutual_knowledge_transfer(
        received, local, data, SgdParams(lr=lr1, **one_batch), SgdParams(lr=lr2, **one_batch), torch.Generator()
    )
    assert np.allclose(received.weight.detach().numpy(), w1_expected, atol=1e-6)
    assert np.allclose(local.weight.detach().numpy(), w2_expected, atol=1e-6)


def test_mkt_losses_are_ce_plus_kl_of_the_detached_other() -> None:
    z1, z2 = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[0.0, 1.0, 0.5]])
    y = torch.tensor([1])
    loss1, loss2 = mkt_losses(z1, z2, y)
    p1, p2 = torch.softmax(z1, 1), torch.softmax(z2, 1)
    kl_21 = (p2 * (p2.log() - p1.log())).sum()
    kl_12 = (p1 * (p1.log() - p2.log())).sum()
    assert torch.isclose(loss1, -p1[0, 1].log() + kl_21)
    assert torch.isclose(loss2, -p2[0, 1].log() + kl_12)
