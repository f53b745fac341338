"""003's DFML formulas (eqs. 2–4, the peak rule) and 004's FML losses (eq. 3), against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dfl_node.learning.mutual import (
    CycleState,
    alpha_at,
    class_proportions,
    cyclic_alpha,
    dfml_losses,
    fml_losses,
    kl_weights,
    peak_threshold,
    peak_updates,
    updates_peak,
    weighted_kl,
    wsm_loss,
)


def test_wsm_is_eq2_by_hand() -> None:
    z = torch.tensor([[1.0, 2.0, 0.0]])
    # β = (½, ½, 0): class 2 leaves the normaliser, log(½e¹ + ½e²) = log 5.053669 = 1.620114; loss −(2 − 1.620114)
    assert wsm_loss(z, torch.tensor([1]), torch.tensor([0.5, 0.5, 0.0])).item() == pytest.approx(-0.379886, abs=1e-6)
    # uniform β: CE − log C, so the gradient is CE's
    uniform = torch.full((3,), 1 / 3)
    assert wsm_loss(z, torch.tensor([0]), uniform).item() == pytest.approx(
        F.cross_entropy(z, torch.tensor([0])).item() - math.log(3), abs=1e-6)
    # a batch: the mean of its samples
    batch = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    beta = torch.tensor([0.25, 0.25, 0.5])
    by_hand = [-(2 - math.log(0.25 * math.e + 0.25 * math.e ** 2 + 0.5)),
               -(3 - math.log(0.25 + 0.25 + 0.5 * math.e ** 3))]
    assert wsm_loss(batch, torch.tensor([1, 2]), beta).item() == pytest.approx(sum(by_hand) / 2, abs=1e-6)


def test_class_proportions_are_the_share_of_each_label() -> None:
    assert class_proportions(torch.tensor([0, 0, 2, 2, 2, 1, 0, 0]), 4).tolist() == [0.5, 0.125, 0.375, 0.0]


def test_weighted_kl_is_eq3_by_hand() -> None:
    assert kl_weights([1, 2, 3], 0) == [0.0, 0.4, 0.6]
    assert kl_weights([1, 2, 3], 1) == [0.25, 0.0, 0.75]
    probs = [torch.tensor([[0.5, 0.5]]), torch.tensor([[0.9, 0.1]]), torch.tensor([[0.2, 0.8]])]
    log_probs = [p.log() for p in probs]
    # KL(p1 ‖ p0) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.368064, KL(p2 ‖ p0) = 0.2 ln 0.4 + 0.8 ln 1.6 = 0.192745
    assert weighted_kl(log_probs, 0, [1, 2, 3]).item() == pytest.approx(0.4 * 0.368064 + 0.6 * 0.192745, abs=1e-6)
    # equal sizes: the plain mean of the teachers' KLs
    assert weighted_kl(log_probs, 0, [5, 5, 5]).item() == pytest.approx((0.368064 + 0.192745) / 2, abs=1e-6)


def test_dfml_loss_is_eq1_and_teachers_are_constant_targets() -> None:
    logits = [torch.tensor([[0.0, 0.0]], requires_grad=True), torch.tensor([[math.log(9), 0.0]], requires_grad=True),
              torch.tensor([[0.0, math.log(4)]], requires_grad=True)]  # p = (½, ½), (0.9, 0.1), (0.2, 0.8)
    labels, beta = torch.tensor([0]), torch.tensor([0.5, 0.5])
    losses = dfml_losses(logits, labels, 0.25, [1, 2, 3], lambda z, y: wsm_loss(z, y, beta))
    wsm0 = -(0.0 - math.log(0.5 + 0.5))  # z_y = 0, log(½e⁰ + ½e⁰) = 0
    assert losses[0].item() == pytest.approx(0.75 * wsm0 + 0.25 * (0.4 * 0.368064 + 0.6 * 0.192745), abs=1e-6)
    losses[0].backward()
    assert logits[1].grad is None and logits[2].grad is None  # the student's loss moves the student only
    only_supervision = dfml_losses(logits, labels, 0.0, [1, 2, 3], F.cross_entropy)
    assert only_supervision[1].item() == pytest.approx(-math.log(0.9), abs=1e-6)


def test_fml_losses_are_004_eq3_by_hand() -> None:
    local = torch.tensor([[0.0, math.log(3)]], requires_grad=True)  # p_local = (¼, ¾)
    meme = torch.tensor([[0.0, 0.0]], requires_grad=True)  # p_meme = (½, ½)
    loss_local, loss_meme = fml_losses(local, meme, torch.tensor([0]), alpha=0.3, beta=0.6)
    # CE_local = ln 4 = 1.386294, KL(p_meme ‖ p_local) = ½ ln 2 + ½ ln ⅔ = 0.143841
    assert loss_local.item() == pytest.approx(0.3 * 1.386294 + 0.7 * 0.143841, abs=1e-6)
    # CE_meme = ln 2 = 0.693147, KL(p_local ‖ p_meme) = ¼ ln ½ + ¾ ln 1.5 = 0.130812
    assert loss_meme.item() == pytest.approx(0.6 * 0.693147 + 0.4 * 0.130812, abs=1e-6)
    loss_local.backward()
    assert meme.grad is None  # the meme's prediction is the local model's constant target
    with_wsm, _ = fml_losses(local.detach(), meme.detach(), torch.tensor([0]), 1.0, 1.0,
                             lambda z, y: wsm_loss(z, y, torch.tensor([1.0, 0.0])))
    assert with_wsm.item() == pytest.approx(0.0, abs=1e-6)  # one class present: nothing to learn


def test_cyclic_alpha_rises_within_a_cycle_and_the_period_grows() -> None:
    # first cycle: 10 rounds (0 … 9), α = ½(1 − cos(πτ/9)): 0, ¼ at τ = 3, ¾ at τ = 6, 1 at τ = 9
    assert [round(alpha_at(t, 10, 10, 0.0, 1.0), 12) for t in (0, 3, 6, 9)] == [0.0, 0.25, 0.75, 1.0]
    # then 20 rounds (10 … 29), 30 rounds (30 … 59), 40 rounds (60 … 99)
    assert [alpha_at(t, 10, 10, 0.0, 1.0) for t in (10, 29, 30, 59, 60, 99)] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert alpha_at(39, 10, 10, 0.0, 1.0) == pytest.approx(0.5 * (1 - math.cos(math.pi * 9 / 29)))
    assert alpha_at(9, 10, 10, 0.0, 0.9) == 0.9 and alpha_at(3, 10, 10, 0.0, 0.9) == pytest.approx(0.225)
    assert alpha_at(3, 10, 10, 0.2, 0.8) == pytest.approx(0.2 + 0.25 * 0.6)  # α_min + ¼(α_max − α_min)
    assert [alpha_at(t, 4, 0, 0.0, 1.0) for t in range(8)] == pytest.approx([0, 0.25, 0.75, 1] * 2)  # fixed period
    with pytest.raises(ValueError):
        cyclic_alpha(0, 1, 0.0, 1.0)


def test_the_cycle_state_handed_on_round_by_round_gives_the_closed_form() -> None:
    state, seen = CycleState(0, 10), []
    for t in range(120):
        state = state.at(t, 10)
        seen.append(cyclic_alpha(t - state.start, state.period, 0.0, 0.9))
        state = CycleState.decode(state.encode("x"), "x", 10)  # through the round token's strings
    assert seen == [alpha_at(t, 10, 10, 0.0, 0.9) for t in range(120)]
    assert CycleState(0, 10).at(45, 10) == CycleState(30, 30)  # a holder that skipped rounds catches up
    assert CycleState.decode({}, "x", 10) == CycleState(0, 10)


def test_the_peak_rule_by_hand() -> None:
    """One node taking part at rounds 2, 5, 9, 12, 25, 29, 31 of the default schedule (α_max = 1)."""
    def run(updates: int) -> list[int]:
        alpha_n, updated = 0.0, []
        for t in (2, 5, 9, 12, 25, 29, 31):
            cycle = CycleState(0, 10).at(t, 10)
            alpha = alpha_at(t, 10, 10, 0.0, 1.0)
            if updates_peak(alpha, alpha_n, peak_threshold(cycle, updates, 0.0, 1.0)):
                alpha_n = alpha
                updated.append(t)
        return updated

    # α: 0.117, 0.587, 1 (the first maximum: every round up to it), 0.027, 0.895, 1, 0.006
    assert run(1) == [2, 5, 9, 29]
    # A.4.6, five peak updates per cycle: the second cycle's five largest α (rounds 25 … 29) update too
    assert run(5) == [2, 5, 9, 25, 29]
    assert peak_threshold(CycleState(10, 20), 5, 0.0, 1.0) == pytest.approx(0.5 * (1 - math.cos(math.pi * 15 / 19)))
    assert peak_threshold(CycleState(0, 10), 1, 0.0, 0.8) == 0.8
    assert peak_threshold(CycleState(0, 3), 5, 0.1, 0.8) == 0.1
    # a node that missed the maximum updates whenever α is back at its own α_n
    assert updates_peak(0.6, 0.587, 1.0) and not updates_peak(0.5, 0.587, 1.0)
    assert [peak_updates(10, 5), peak_updates(50, 25), peak_updates(50, 10), peak_updates(50, 5)] == [1, 1, 3, 5]
