"""Batched evaluation (dfl_node.learning.evaluation) gives the plain loop's results, in input order.

"Equal" means up to float rounding: the batched paths sum in another order (a grouped convolution, a
batched matmul, a float64 running sum), so a loss may differ in its last digits (we allow 1e-5
relative), and a sample whose two largest logits are within rounding of each other may take the
other class under argmax — one sample of accuracy, never more, per model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dfl_node.learning.datasets import ArrayDataset, load_dataset
from dfl_node.learning.evaluation import (
    MIN_BATCH,
    evaluate_many,
    group_by_architecture,
    stacked_forward,
    step_shape,
)
from dfl_node.learning.models import build_model
from dfl_node.learning.training import Evaluation, evaluate


@pytest.fixture(scope="module")
def digits() -> ArrayDataset:
    train, test = load_dataset("digits")
    return ArrayDataset(torch.cat([test.x, train.x[:640]]), torch.cat([test.y, train.y[:640]]), test.num_classes)


def assert_same(batched: list[Evaluation], loop: list[Evaluation]) -> None:
    assert len(batched) == len(loop)
    for got, want in zip(batched, loop):
        assert got.samples == want.samples
        assert abs(got.accuracy - want.accuracy) * want.samples <= 1 + 1e-9, (got, want)  # an argmax tie may flip
        assert got.loss == pytest.approx(want.loss, rel=1e-5), (got, want)


def models_of(arch: str, shape: tuple[int, int, int], seeds: range, hidden: list[int] | None = None) -> list[nn.Module]:
    return [build_model(arch, shape, 10, hidden=hidden, seed=s) for s in seeds]


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_registry_models_match_the_loop(arch: str, digits: ArrayDataset) -> None:
    models = models_of(arch, digits.input_shape, range(4))
    assert stacked_forward(models, digits.x) is not None  # the fast path is the one under test
    batched = evaluate_many(models, digits)
    loop = [evaluate(m, digits) for m in models]
    assert_same(batched, loop)
    assert len({e.loss for e in batched}) == 4  # four seeds, four different models: nothing was shared by mistake


def test_paper_cnn_on_fashion_mnist_shapes_matches_the_loop() -> None:
    """000's CNN at its real input size (28×28×1), where the grouped convolutions and channels-last
    pooling do real work; random images keep the test free of dataset files."""
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(300, 1, 28, 28, generator=g), torch.randint(0, 10, (300,), generator=g), 10)
    models = models_of("cnn", data.input_shape, range(3))
    assert_same(evaluate_many(models, data), [evaluate(m, data) for m in models])


def test_mixed_architectures_come_back_in_input_order(digits: ArrayDataset) -> None:
    mlps = models_of("mlp", digits.input_shape, range(3), [32, 32])
    cnns = models_of("cnn", digits.input_shape, range(3))
    mixed = [m for pair in zip(mlps, cnns) for m in pair]  # mlp, cnn, mlp, cnn, …
    assert list(group_by_architecture(mixed).values()) == [[0, 2, 4], [1, 3, 5]]
    assert_same(evaluate_many(mixed, digits), [evaluate(m, digits) for m in mixed])


def test_same_shapes_other_configuration_is_another_group() -> None:
    """Equal parameter shapes are not enough: a different padding is a different function."""
    a, b = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1)), nn.Sequential(nn.Conv2d(1, 4, 3, padding=0))
    assert len(group_by_architecture([a, b])) == 2


class _Custom(nn.Module):
    """Not an nn.Sequential: only the vmap path can batch it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 16), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x.flatten(1))))


def _groupnorm_mlp() -> nn.Module:
    """A Sequential with a layer the stacked path does not know (GroupNorm)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.GroupNorm(4, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.mark.parametrize("make", [_Custom, _groupnorm_mlp])
def test_other_architectures_go_through_vmap(make: type[nn.Module], digits: ArrayDataset) -> None:
    torch.manual_seed(0)
    models = [make() for _ in range(3)]
    for m in models:  # norms start at weight 1, bias 0: give each model its own
        for p in m.parameters():
            p.data.normal_(0, 0.3)
    assert stacked_forward(models, digits.x) is None
    assert_same(evaluate_many(models, digits), [evaluate(m, digits) for m in models])


def test_layernorm_cnn_family_is_stacked(digits: ArrayDataset) -> None:
    """003's CNN family: conv + ReLU + max-pool + LayerNorm over each model's (C, H, W), then a classifier."""

    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Conv2d(1, 8, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.LayerNorm([8, 4, 4]),
                              nn.Flatten(), nn.Linear(128, 32), nn.LayerNorm(32), nn.Linear(32, 10))
        for p in model.parameters():
            p.data.normal_(0, 0.3)
        return model

    models = [make(s) for s in range(3)]
    assert stacked_forward(models, digits.x) is not None
    assert_same(evaluate_many(models, digits), [evaluate(m, digits) for m in models])


def test_batchnorm_dropout_and_eval_mode(digits: ArrayDataset) -> None:
    """Running statistics per model are used (eval mode), and dropout is off, as in ``evaluate``."""

    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Dropout(0.5), nn.Flatten(), nn.Linear(6 * 4 * 4, 10))
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2)
        return model.train()  # left in training mode on purpose

    models = [make(s) for s in range(3)]
    assert stacked_forward(models, digits.x) is not None
    batched = evaluate_many(models, digits)
    assert not any(m.training for m in models)
    assert_same(batched, [evaluate(m, digits) for m in models])


def test_small_budget_means_small_steps_and_same_results(digits: ArrayDataset) -> None:
    models = models_of("cnn", digits.input_shape, range(3))
    tight = evaluate_many(models, digits, memory_budget=1)  # one model and MIN_BATCH samples per step
    assert_same(tight, [evaluate(m, digits) for m in models])


def test_step_shape_stays_under_the_budget() -> None:
    per_sample, budget = 200_000, 64 * 2**20
    models, samples = step_shape(50, 10_000, per_sample, budget)
    assert models * samples * per_sample <= budget and samples >= MIN_BATCH and models < 50
    assert step_shape(50, 10_000, 6_000, budget)[0] == 50  # a small model: all at once
    assert step_shape(5, 10, 6_000, budget) == (5, 10)  # never more samples than the data has
    assert step_shape(8, 10_000, 10**9, budget) == (1, MIN_BATCH)  # over budget: the smallest step


def test_a_group_of_one_is_the_loop_exactly(digits: ArrayDataset) -> None:
    model = build_model("mlp", digits.input_shape, 10, seed=7)
    assert evaluate_many([model], digits) == [evaluate(model, digits)]
    assert evaluate_many([], digits) == []
