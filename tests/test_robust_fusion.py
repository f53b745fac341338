"""The robust fusion math and the attacks, as plain functions, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dfl_node.learning.attacks import flipped_labels, noisy, scaled, sign_flipped
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import average_states
from dfl_node.learning.robust import aggregate_states, capped_count, relative_distance, robust_average
from dfl_node.learning.tensors import TensorPart, parts_from_state


def states(*rows: list[float]) -> list[dict[str, torch.Tensor]]:
    """One state per row: a float tensor ``w`` of the row's values and an integer counter ``n`` (the row's index)."""
    return [{"w": torch.tensor(row), "n": torch.tensor(i)} for i, row in enumerate(rows)]


def test_the_coordinate_wise_median_of_an_odd_and_an_even_count() -> None:
    odd = robust_average(states([1.0, 9.0], [2.0, -5.0], [100.0, 0.0]), "median", 0.2)
    assert odd["w"].tolist() == [2.0, 0.0]  # per coordinate: the 100 and the 9 are outvoted
    even = robust_average(states([1.0, 4.0], [3.0, 0.0], [100.0, 2.0], [-50.0, 6.0]), "median", 0.2)
    assert even["w"].tolist() == [2.0, 3.0]  # the mean of the two middle values: (1 + 3) / 2, (2 + 4) / 2
    assert odd["n"].item() == 0 and even["n"].item() == 0  # integer entries: the first state's


def test_the_trimmed_mean_cuts_floor_trim_n_at_each_end() -> None:
    rows = states([1.0], [2.0], [3.0], [4.0], [1000.0])
    assert robust_average(rows, "trimmed-mean", 0.2)["w"].item() == pytest.approx(3.0)  # 1 cut each end: (2+3+4)/3
    assert robust_average(rows, "trimmed-mean", 0.1)["w"].item() == pytest.approx(202.0)  # floor(0.5) = 0: the mean
    with pytest.raises(ValueError, match="outside"):
        robust_average(rows, "trimmed-mean", 0.5)


def test_of_two_models_both_rules_are_the_plain_mean_whatever_the_counts() -> None:
    pair = states([1.0, 10.0], [3.0, 20.0])
    for rule in ("median", "trimmed-mean"):
        assert aggregate_states(pair, [1, 10**9], rule, 0.2)["w"].tolist() == [2.0, 15.0]


def test_mean_is_the_sample_weighted_average_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    group = [{"w": torch.randn(50, generator=g)} for _ in range(4)]
    weights = [10, 20, 30, 45]
    assert torch.equal(aggregate_states(group, weights, "mean", 0.2)["w"], average_states(group, weights)["w"])


def test_relative_distance_over_what_the_parts_carry() -> None:
    own = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([[1.0, 1.0], [1.0, 1.0]])}
    flipped = parts_from_state({k: -v for k, v in own.items()})
    assert relative_distance(own, flipped) == pytest.approx(2.0)  # ‖−w − w‖ = 2‖w‖
    segment = (TensorPart("a", (2,), 1, torch.tensor([0.0])),)  # element 1 of a only: |0 − 4| / |4|
    assert relative_distance(own, segment) == pytest.approx(1.0)
    whole_b = (TensorPart("b", (2, 2), 0, torch.tensor([1.0, 1.0, 1.0, 3.0])),)
    assert relative_distance(own, whole_b) == pytest.approx(2.0 / 2.0)
    other_architecture = (TensorPart("a", (3,), 0, torch.zeros(3)), TensorPart("c", (1,), 0, torch.zeros(1)))
    assert relative_distance(own, other_architecture) is None


def test_a_claimed_count_is_capped_at_a_multiple_of_ours() -> None:
    assert capped_count(10**9, 120, 2.0) == 240
    assert capped_count(100, 120, 2.0) == 100
    assert capped_count(5, 0, 2.0) == 1  # never a weight of 0 on both sides
    assert capped_count(-3, 120, 2.0) == 0


def test_the_attacks() -> None:
    w, ref = torch.tensor([1.0, -2.0]), torch.tensor([0.5, -1.0])
    assert sign_flipped(w, 1.0).tolist() == [-1.0, 2.0]
    assert scaled(w, ref, 10.0).tolist() == [5.5, -11.0]  # ref + 10 (w − ref)
    first, again = (noisy(torch.zeros(1000), 0.5, torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(first, again) and math.isclose(float(first.std()), 0.5, rel_tol=0.1)
    data = ArrayDataset(torch.zeros(3, 2), torch.tensor([0, 3, 9]), 10)
    assert flipped_labels(data).y.tolist() == [9, 6, 0]
