"""Membership inference: what a curious member learns about a peer's training data from the model it receives
(the leak, measured: docs/privacy.md).

The attack is Yeom et al.'s loss threshold (CSF 2018): a model fits the samples it trained on better than others,
so a sample's score is minus its loss under the model (:meth:`~dfl_node.learning.tasks.Task.sample_losses`), and
the higher the score, the likelier a member. It is judged as Carlini et al. (S&P 2022, LiRA) ask an attack to be
judged, over a node's training samples (members) against samples it never trained on (non-members):

* the ROC AUC of the score, threshold-free (:func:`attack_auc`);
* the TPR at 1 % FPR (:func:`tpr_at_fpr`): the members an attacker finds when it may wrongly accuse few;
* and what a curious member would actually decide, having no labels for its victim's samples: a threshold it
  calibrates on its *own* data — its training samples against its own held-out ones, scored by the model it
  received, which learnt from every member's data through the fleet's fusions — applied to the victim's samples,
  reported as Yeom's membership advantage, TPR − FPR (:func:`calibrated_threshold`, :func:`advantage`).

Every comparison is between equal numbers of members and non-members, the larger set subsampled by a seeded
generator to the smaller's size (:func:`balanced`), so that an AUC of 0.5 and an advantage of 0 mean chance.
The attack only reads: it evaluates models in eval mode without gradients, draws from no generator but its own,
and changes no model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.tasks import Task, roc_auc
from dfl_node.results import MembershipInference

LOW_FPR = 0.01  # the FPR the TPR is reported at (Carlini et al.'s "low FPR" regime, at the resolution a node allows)
# A validation split of fewer samples is replaced by the global test set as the non-members: below it the AUC's
# resolution (1/samples²) and the FPR's (1/samples) say little. The test set is not drawn as a non-IID node's
# training data is, so its samples may be told apart by their classes as well as by membership: docs/privacy.md.
MIN_HELD_OUT = 20
STREAM = 47  # the subsampling's seed stream, apart from provisioning's (1 and 2)


def scores(task: Task, model: nn.Module, data: ArrayDataset) -> torch.Tensor:
    """The attack's score of each sample of ``data`` under ``model``: minus its loss (float64, on the CPU)."""
    return -task.sample_losses(model, data).cpu()


def balanced(members: torch.Tensor, non_members: torch.Tensor,
             rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Equal numbers of member and non-member scores: the larger set subsampled without replacement (drawn from
    ``rng``, in the sets' order) to the smaller's size."""
    size = min(len(members), len(non_members))

    def take(values: torch.Tensor) -> torch.Tensor:
        if len(values) == size:
            return values
        return values[torch.from_numpy(np.sort(rng.choice(len(values), size=size, replace=False)))]

    return take(members), take(non_members)


def attack_auc(members: torch.Tensor, non_members: torch.Tensor) -> float:
    """The ROC AUC of the scores, members positive: the chance a member outscores a non-member, ties half."""
    flags = torch.cat([torch.ones(len(members), dtype=torch.int64), torch.zeros(len(non_members), dtype=torch.int64)])
    return roc_auc(torch.cat([members, non_members]), flags)


def tpr_at_fpr(members: torch.Tensor, non_members: torch.Tensor, fpr: float = LOW_FPR) -> float:
    """The largest TPR of a threshold whose FPR is at most ``fpr`` (0 < fpr < 1): with n non-members, k = ⌊fpr·n⌋
    of them may be flagged, so the threshold sits at the (k+1)-th highest non-member score and the members strictly
    above it count (one tied with it does not: neither is a non-member tied with it flagged). No interpolation
    between ROC points. With fewer than 1/fpr non-members k is 0: the members above every non-member, the TPR at an
    FPR of 0 — a lower bound of the TPR at ``fpr``, at the resolution the data allows."""
    allowed = math.floor(round(fpr * len(non_members), 9))  # ⌊fpr·n⌋, not fooled by 0.01·300 = 2.9999…
    cut = torch.sort(non_members, descending=True).values[allowed]
    return float((members > cut).double().mean())


def _at_least(values: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """For each threshold, the share of ``values`` at or above it."""
    below = torch.searchsorted(torch.sort(values).values, thresholds, side="left")
    return (len(values) - below).double() / len(values)


def calibrated_threshold(members: torch.Tensor, non_members: torch.Tensor) -> float:
    """The threshold τ (flag a sample as a member when its score ≥ τ) that best tells ``members`` from
    ``non_members`` — the largest TPR − FPR, i.e. balanced accuracy — among the scores seen, the lowest of equals:
    how a curious member calibrates the attack on data whose membership it knows, its own."""
    candidates = torch.unique(torch.cat([members, non_members]))  # ascending
    gap = _at_least(members, candidates) - _at_least(non_members, candidates)
    return float(candidates[torch.argmax(gap)])  # argmax: the first of equal maxima


def advantage(members: torch.Tensor, non_members: torch.Tensor, threshold: float) -> float:
    """Yeom's membership advantage of flagging scores ≥ ``threshold``: TPR − FPR (0: chance; balanced accuracy is
    (1 + advantage) / 2)."""
    at = torch.tensor([threshold], dtype=torch.float64)
    return float(_at_least(members, at) - _at_least(non_members, at))


@dataclass(frozen=True)
class Holder:
    """What a node holds at the end of a run: its final model (the one it sends) and its data."""

    node_id: str
    model: nn.Module
    train: ArrayDataset
    val: ArrayDataset


def held_out(node: Holder, test: ArrayDataset | None, task: Task) -> tuple[ArrayDataset, str]:
    """The samples ``node`` never trained on, and where they came from: its validation split — drawn from its own
    data, as its training samples are — or the global test set where the split holds fewer than
    :data:`MIN_HELD_OUT` samples of those training reads (:meth:`~dfl_node.learning.tasks.Task.supervised`: an
    autoencoder's normal ones)."""
    usable = len(task.supervised(node.val))
    if usable >= MIN_HELD_OUT or test is None:
        if not usable:
            raise ValueError(f"{node.node_id} holds no held-out samples to attack its model with")
        return node.val, "validation"
    return test, "test"


def attack(victim: Holder, attacker: Holder, task: Task, test: ArrayDataset | None,
           rng: np.random.Generator) -> MembershipInference:
    """``attacker``'s attack on ``victim``'s final model: the AUC and TPR at 1 % FPR over the victim's training
    samples against its held-out ones (:func:`held_out`), and the advantage of the threshold the attacker calibrates
    on its own training and held-out samples, scored by the same model; each comparison :func:`balanced` by
    ``rng``."""
    victim_out, source = held_out(victim, test, task)
    members, non_members = balanced(scores(task, victim.model, victim.train),
                                    scores(task, victim.model, victim_out), rng)
    own_members, own_non_members = balanced(scores(task, victim.model, attacker.train),
                                            scores(task, victim.model, held_out(attacker, test, task)[0]), rng)
    if not len(members) or not len(own_members):
        raise ValueError(f"{victim.node_id} or {attacker.node_id} holds no training samples to attack with")
    threshold = calibrated_threshold(own_members, own_non_members)
    return MembershipInference(attacker=attacker.node_id, held_out=source, samples=len(members),
                               auc=attack_auc(members, non_members), tpr_at_1pct_fpr=tpr_at_fpr(members, non_members),
                               advantage=advantage(members, non_members, threshold))


def fleet_attacks(nodes: list[Holder], task: Task, test: ArrayDataset | None,
                  seed: int) -> dict[str, MembershipInference]:
    """Every node's final model attacked by a curious peer, the next node in the order of ``nodes`` (the last by
    the first), by node id; each victim's subsampling seeded by ``seed`` and its place, a stream of its own. A
    fleet of one node has no peer to attack it: none."""
    if len(nodes) < 2:
        return {}
    return {victim.node_id: attack(victim, nodes[(i + 1) % len(nodes)], task, test,
                                   np.random.default_rng([seed, STREAM, i]))
            for i, victim in enumerate(nodes)}
