"""Membership inference ("the leak, measured"): the attack's figures on hand-built scores, the attack on a
model that overfit and on one that has no members among the samples compared, and the simulator's
``privacy_audit``, which reports the attack and changes no bit of the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dfl_node.learning.datasets import ArrayDataset, load_dataset
from dfl_node.learning.membership_inference import (
    MIN_HELD_OUT,
    Holder,
    advantage,
    attack,
    attack_auc,
    balanced,
    calibrated_threshold,
    held_out,
    scores,
    tpr_at_fpr,
)
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.tasks import Anomaly, Classification, Regression
from dfl_node.learning.training import SgdParams, local_sgd
from dfl_node.results import read_results, write_results
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim import run_fleet
from tests.helpers.cli import invoke


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ----------------------------------------------------------------------------- the figures, by hand

def test_auc_is_one_for_separated_scores_a_half_for_identical_ones_and_counts_pairs() -> None:
    assert attack_auc(t(5, 6, 7), t(1, 2, 3)) == 1.0
    assert attack_auc(t(1, 2, 3), t(5, 6, 7)) == 0.0
    assert attack_auc(t(4, 4, 4), t(4, 4, 4)) == 0.5
    # members 3, 1 against 2, 0: 3 > 2, 3 > 0, 1 < 2, 1 > 0, three pairs of four
    assert attack_auc(t(3, 1), t(2, 0)) == 0.75
    # members 2, 1 against 1, 0: 2 > 1, 2 > 0, 1 = 1 (half), 1 > 0
    assert attack_auc(t(2, 1), t(1, 0)) == 3.5 / 4


def test_tpr_at_fpr_sits_above_the_highest_non_members_it_may_flag() -> None:
    non_members = torch.arange(200, dtype=torch.float64)  # 0 … 199: 1 % of them is 2, so the cut is at 197
    assert tpr_at_fpr(t(198, 197, 199.5, 10), non_members) == 0.5  # 198 and 199.5; 197, tied with the cut, not
    # fewer than 100 non-members may flag none: the members above all of them (the TPR at an FPR of 0)
    assert tpr_at_fpr(t(30, 28.5, 29, 1), torch.arange(29, dtype=torch.float64)) == 0.75
    assert tpr_at_fpr(t(3, 3), t(3, 3)) == 0.0  # nothing tells them apart: nothing found
    assert tpr_at_fpr(t(1, 2, 3), torch.arange(300, dtype=torch.float64) + 10) == 0.0
    # 1 % of 300 is 3 (not 2.999…): the fourth-highest non-member, 296, is the cut
    assert tpr_at_fpr(t(296.5, 296), torch.arange(300, dtype=torch.float64)) == 0.5


def test_the_calibrated_threshold_maximises_tpr_minus_fpr_and_the_advantage_applies_it() -> None:
    # thresholds 1, 2, 5, 6, 7 give TPR − FPR 0, 1/3, 2/3, 1/3, 1/3: 5 is the attacker's
    assert calibrated_threshold(t(5, 6, 7), t(1, 2, 6)) == 5.0
    assert advantage(t(5, 6, 7), t(1, 2, 6), 5.0) == pytest.approx(2 / 3)
    assert advantage(t(5, 6, 7), t(1, 2, 3), 5.0) == 1.0
    assert advantage(t(1, 2), t(5, 6), 5.0) == -1.0  # a threshold calibrated elsewhere may do worse than chance
    assert calibrated_threshold(t(1, 1), t(1, 1)) == 1.0 and advantage(t(1, 1), t(1, 1), 1.0) == 0.0


def test_balanced_subsamples_the_larger_side_to_the_smaller_seeded() -> None:
    members, non_members = torch.arange(50, dtype=torch.float64), t(-1, -2, -3)
    a = balanced(members, non_members, np.random.default_rng(7))
    b = balanced(members, non_members, np.random.default_rng(7))
    assert len(a[0]) == len(a[1]) == 3 and torch.equal(a[1], non_members) and torch.equal(a[0], b[0])
    assert set(a[0].tolist()) <= set(members.tolist()) and len(set(a[0].tolist())) == 3
    assert [len(x) for x in balanced(non_members, members, np.random.default_rng(7))] == [3, 3]


# ----------------------------------------------------------------------------- per-sample losses, through the task

def test_each_tasks_sample_losses_are_its_training_loss_of_each_sample() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=g)
    model = torch.nn.Linear(5, 3)
    labelled = ArrayDataset(x, torch.randint(0, 3, (12,), generator=g), 3)
    expected = F.cross_entropy(model(x).double(), labelled.y, reduction="none")
    assert torch.allclose(Classification().sample_losses(model, labelled), expected)
    targets = ArrayDataset(x, torch.randn(12, 3, generator=g), 3)
    squared = (model(x).double() - targets.y.double()).square().mean(1)
    assert torch.allclose(Regression().sample_losses(model, targets), squared)
    assert torch.allclose(Regression(huber=True).sample_losses(model, targets),
                          F.huber_loss(model(x).double(), targets.y.double(), reduction="none").mean(1))
    # an autoencoder's: the reconstruction error of the samples it trains on, the normal ones (flag 0)
    autoencoder, flags = torch.nn.Linear(5, 5), torch.tensor([0, 1] * 6)
    flagged = ArrayDataset(x, flags, 2)
    normal = ArrayDataset(x[flags == 0], flags[flags == 0], 2)
    assert torch.allclose(Anomaly().sample_losses(autoencoder, flagged), Anomaly().scores(autoencoder, normal))


# ----------------------------------------------------------------------------- the attack on real models

@pytest.fixture(scope="module")
def digits() -> tuple[ArrayDataset, ArrayDataset]:
    return load_dataset("digits")


def trained(data: ArrayDataset, epochs: int) -> torch.nn.Module:
    """A small MLP trained on ``data`` for ``epochs`` passes (many: it overfits)."""
    model = ModelSpec("mlp", (64,)).build(data.input_shape, data.num_classes, seed=0)
    local_sgd(model, data, SgdParams(lr=0.1, momentum=0.9, batch_size=20, epochs=epochs),
              torch.Generator().manual_seed(0))
    return model


def test_a_model_that_overfit_few_samples_gives_them_away(digits: tuple[ArrayDataset, ArrayDataset]) -> None:
    train, test = digits
    members, non_members = train.subset(range(50)), test.subset(range(100))
    model = trained(members, epochs=300)
    task = Classification()
    member_scores, non_member_scores = scores(task, model, members), scores(task, model, non_members)
    assert attack_auc(member_scores, non_member_scores) > 0.75
    assert tpr_at_fpr(member_scores, non_member_scores) > 0.01
    # the same model, two sets it never trained on (300 samples each): chance, within 4 standard errors of the
    # AUC under no signal, √((n+m+1)/(12nm)) ≈ 0.024
    other, unseen = train.subset(range(500, 800)), test.subset(range(60, 360))
    assert abs(attack_auc(scores(task, model, other), scores(task, model, unseen)) - 0.5) < 0.1


def test_a_curious_peer_attacks_with_a_threshold_from_its_own_data(digits: tuple[ArrayDataset, ArrayDataset]) -> None:
    train, test = digits
    # one model trained on the victim's data and the peer's, as a fleet's fusions train every member's on all
    model = trained(train.subset(range(0, 100)), epochs=300)
    victim = Holder("node-0", model, train.subset(range(0, 50)), train.subset(range(1000, 1070)))
    peer = Holder("node-1", model, train.subset(range(50, 100)), train.subset(range(1100, 1150)))
    figures = attack(victim, peer, Classification(), test, np.random.default_rng(0))
    # 50 members against 50 of the victim's 70 held-out samples; its threshold, from the peer's own, finds them
    assert figures.attacker == "node-1" and figures.held_out == "validation" and figures.samples == 50
    assert figures.auc > 0.6 and figures.advantage > 0.2 and figures.tpr_at_1pct_fpr > 0
    # a validation split too small is replaced by the test set, and said so; with none, there is nothing to attack
    task = Classification()
    tiny = Holder("node-2", model, victim.train, train.subset(range(1000, 1000 + MIN_HELD_OUT - 1)))
    assert held_out(tiny, test, task) == (test, "test") and held_out(tiny, None, task) == (tiny.val, "validation")
    assert attack(tiny, peer, task, test, np.random.default_rng(0)).held_out == "test"
    with pytest.raises(ValueError, match="node-3 holds no held-out samples"):
        held_out(Holder("node-3", model, victim.train, train.subset([])), None, task)
    with pytest.raises(ValueError, match="node-4 or node-1 holds no training samples"):
        attack(Holder("node-4", model, train.subset([]), victim.val), peer, task, test, np.random.default_rng(0))


# ----------------------------------------------------------------------------- in the simulator

SMALL = dict(nodes=4, rounds=4, eval_every=4, batch_size=20, mkt_batch_size=20, lr=0.05, hidden=[32, 32], threads=1)


def test_the_privacy_audit_reports_the_attack_and_changes_no_bit_of_the_run(tmp_path: Path) -> None:
    plain = run_fleet(ExperimentConfig(**SMALL), "defkt")
    audited = run_fleet(ExperimentConfig(**SMALL, privacy_audit=True), "defkt")
    assert [n.param_sha256 for n in audited.nodes] == [n.param_sha256 for n in plain.nodes]
    assert audited.history == plain.history
    attacks = [n.membership_inference for n in audited.nodes]
    assert [a.attacker for a in attacks if a] == ["node-1", "node-2", "node-3", "node-0"]
    assert all(a and a.held_out == "validation" and 0 <= a.auc <= 1 and 0 <= a.tpr_at_1pct_fpr <= 1 for a in attacks)
    summary = audited.membership_inference
    assert summary is not None and summary.nodes == 4
    assert summary.max_auc == max(a.auc for a in attacks if a)
    # written and read back; without the option, absent from the JSON (not null): the file is what it was
    write_results(audited, tmp_path / "on")
    write_results(plain, tmp_path / "off")
    assert read_results(tmp_path / "on" / "defkt.json").membership_inference == summary
    written = json.loads((tmp_path / "off" / "defkt.json").read_text())
    assert "membership_inference" not in written and all("membership_inference" not in n for n in written["nodes"])


def test_a_testbed_refuses_the_audit_in_a_line() -> None:
    result = invoke("testbed", "--privacy-audit")
    assert result.exit_code == 2 and "--privacy-audit: the simulator attacks its nodes' models" in result.output
