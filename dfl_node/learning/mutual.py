"""Mutual learning across many models: 003's DFML (eqs. 1–4, peak models) and 004's FML (eq. 3).

Pure functions over logits, labels and models; the algorithms in ``dfl_node.algorithms`` only decide
who runs them on which node. Readings of what the papers leave open, made here once:

* **WSM (003 eq. 2)**: ``−[z_y − log Σ_c β_c e^{z_c}]`` with β the class proportions of the data
  being trained on — the aggregator's during mutual learning, the client's own during local
  training — computed as ``logsumexp(z + log β)``, so a class absent from the data (β_c = 0,
  log 0 = −∞) drops out of the normaliser. With uniform β it is CE − log C: CE's gradient.
* **Batch means**: eqs. 2–3 are written as sums over the batch; like 000's MKT (``fusion.py``) they
  are averaged over it, so the learning rates stay those of plain SGD. KL is ``batchmean``.
* **Weighted KL (003 eq. 3)**: for student n, ``Σ_{q≠n} Φ_q / Σ_{u≠n} Φ_u · KL(p_q ‖ p_n)`` with
  Φ the trainable parameter count and each teacher's prediction a constant (detached) target.
  Temperature 1 (003 A.2).
* **One step for all**: every model's logits on the batch first, then each model steps on its own
  loss with its own optimiser (a simultaneous step, as 000's MKT).
* **Cyclic α (003 eq. 4, A.2, Fig. 11)**: α rises from α_min to α_max within a cycle by a half
  cosine, ``α = α_min + ½(α_max − α_min)(1 − cos(π·τ/(P − 1)))`` for the cycle's rounds
  τ = 0 … P − 1, so a cycle's first round is pure supervision and its last reaches α_max exactly;
  the first period P is ``period`` (10) and every completed cycle adds ``growth`` (10:
  "incrementally increased after each completion"). The state an aggregator hands to the next —
  the round the current cycle began and its period (A.2) — is :class:`CycleState`.
* **Peak models (003 §3.2.2, Alg. 1, A.4.6)**: a participant copies its updated model into its
  peak model when ``α^(t) ≥ min(α_n, α_k)``, then sets ``α_n ← α^(t)``; α_n is the α of its last
  peak update (0 at the start) and α_k the k-th largest α of the current cycle. With k = 1 (003's
  default, 50 % senders) α_k = α_max ≥ α_n, which is Alg. 1's ``α^(t) ≥ α_n``: every round up to
  the first maximum (α only rises in a cycle), then whenever α is back at α_n. A.4.6 lets low
  participation update at the cycle's largest k values; its text gives k = N/|S| but its example
  (|S| = 10 % → five updates) is N/(2|S|), which is also 1 at 50 %: :func:`peak_updates` takes that.
* **FML (004 eq. 3)**: ``L_local = α·CE + (1−α)·KL(p_meme ‖ p_local)``, ``L_meme = β·CE +
  (1−β)·KL(p_local ‖ p_meme)``, the other's prediction a constant target, one simultaneous step.
  With 003's fair-comparison setting the supervision term is WSM instead of CE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.training import PrivateSteps, SgdParams, release, sgd, shuffled_batches

Supervision = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, labels) -> mean loss
# (student's outputs, teacher's) -> how far apart, batch mean, the teacher a constant: a task's distillation
# (dfl_node.learning.tasks.Task.distance); None where it is KL between class probabilities, computed as below
Distance = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------------------- losses

def class_proportions(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """β of eq. 2: the share of each class in ``labels`` (float32, on the labels' device)."""
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float32)
    return counts / counts.sum().clamp_min(1)


def wsm_loss(logits: torch.Tensor, labels: torch.Tensor, proportions: torch.Tensor) -> torch.Tensor:
    """003 eq. 2, batch mean: ``−[z_y − log Σ_c β_c e^{z_c}]``; classes with β_c = 0 leave the normaliser."""
    log_beta = torch.log(proportions.to(logits.dtype))  # −inf where a class is absent
    normaliser = torch.logsumexp(logits + log_beta, dim=1)
    return (normaliser - logits.gather(1, labels[:, None]).squeeze(1)).mean()


def supervision(kind: str, proportions: torch.Tensor | None = None) -> Supervision:
    """The supervision term: ``ce`` (cross-entropy) or ``wsm`` (eq. 2 with ``proportions``)."""
    if kind == "ce":
        return F.cross_entropy
    if kind != "wsm" or proportions is None:
        raise ValueError(f"supervision {kind!r}: expected ce, or wsm with class proportions")
    return lambda logits, labels: wsm_loss(logits, labels, proportions)


def kl_weights(param_counts: Sequence[int], student: int) -> list[float]:
    """003 eq. 3's teacher weights for ``student``: Φ_q / Σ_{u≠n} Φ_u for every q (0 for the student itself)."""
    total = sum(c for q, c in enumerate(param_counts) if q != student)
    return [0.0 if q == student or not total else c / total for q, c in enumerate(param_counts)]


def weighted_kl(log_probs: Sequence[torch.Tensor], student: int, param_counts: Sequence[int]) -> torch.Tensor:
    """003 eq. 3, batch mean: ``Σ_{q≠n} Φ_q/Σ_{u≠n}Φ_u · KL(p_q ‖ p_n)``, the teachers' predictions detached."""
    weights = kl_weights(param_counts, student)
    total = log_probs[student].new_zeros(())
    for q, (teacher, weight) in enumerate(zip(log_probs, weights)):
        if q != student:
            kl = F.kl_div(log_probs[student], teacher.detach(), reduction="batchmean", log_target=True)
            total = total + weight * kl
    return total


def dfml_losses(logits: Sequence[torch.Tensor], labels: torch.Tensor, alpha: float,
                param_counts: Sequence[int], supervise: Supervision, distance: Distance | None = None
                ) -> list[torch.Tensor]:
    """003 eq. 1 for every participant n: ``(1 − α)·L_WSM(z_n) + α·L_KL(n)``; a term whose factor is 0
    is not computed (it could only add 0). With a task's ``distance`` in place of KL, its eq.-3 weighting of the
    teachers stays: ``Σ_{q≠n} Φ_q/Σ_{u≠n}Φ_u · d(z_n, z_q)``."""
    log_probs = [F.log_softmax(z, dim=1) for z in logits] if alpha and distance is None else []
    losses = []
    for n, z in enumerate(logits):
        loss = z.new_zeros(())
        if alpha != 1:
            loss = loss + (1 - alpha) * supervise(z, labels)
        if alpha and distance is None:
            loss = loss + alpha * weighted_kl(log_probs, n, param_counts)
        elif alpha and distance is not None:
            weights = kl_weights(param_counts, n)
            loss = loss + alpha * sum((w * distance(z, teacher) for q, (teacher, w) in
                                       enumerate(zip(logits, weights, strict=True)) if q != n), z.new_zeros(()))
        losses.append(loss)
    return losses


def fml_losses(logits_local: torch.Tensor, logits_meme: torch.Tensor, labels: torch.Tensor, alpha: float,
               beta: float, supervise: Supervision = F.cross_entropy,
               distance: Distance | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """004 eq. 3: ``(L_local, L_meme)``, each with the other's prediction as a constant target (a task's
    ``distance`` in place of KL)."""
    if distance is None:
        log_local, log_meme = F.log_softmax(logits_local, dim=1), F.log_softmax(logits_meme, dim=1)
        kl_local = F.kl_div(log_local, log_meme.detach(), reduction="batchmean", log_target=True)  # KL(p_meme‖p_local)
        kl_meme = F.kl_div(log_meme, log_local.detach(), reduction="batchmean", log_target=True)  # KL(p_local‖p_meme)
    else:
        kl_local, kl_meme = distance(logits_local, logits_meme), distance(logits_meme, logits_local)
    loss_local = alpha * supervise(logits_local, labels) + (1 - alpha) * kl_local
    loss_meme = beta * supervise(logits_meme, labels) + (1 - beta) * kl_meme
    return loss_local, loss_meme


# ----------------------------------------------------------------------------------------- α schedule

@dataclass(frozen=True)
class CycleState:
    """What one aggregator hands the next (003 A.2): the round the current α cycle began, and its period."""

    start: int = 0
    period: int = 10

    def at(self, round_: int, growth: int) -> CycleState:
        """The cycle that ``round_`` falls in: completed cycles are left behind, each adding ``growth``."""
        start, period = self.start, self.period
        if round_ < start:
            raise ValueError(f"round {round_} is before the current α cycle (began at {start})")
        while round_ - start >= period:
            start, period = start + period, period + growth
        return CycleState(start, period)

    def encode(self, prefix: str) -> dict[str, str]:
        return {f"{prefix}.cycle_start": str(self.start), f"{prefix}.period": str(self.period)}

    @classmethod
    def decode(cls, state: Mapping[str, str], prefix: str, period: int) -> CycleState:
        """The state a plan handed on, or the first cycle (starting at round 0) if there is none."""
        return cls(int(state.get(f"{prefix}.cycle_start", 0)), int(state.get(f"{prefix}.period", period)))


def cyclic_alpha(tau: int, period: int, alpha_min: float, alpha_max: float) -> float:
    """α at round ``tau`` (0 … period − 1) of a cycle: a half cosine from α_min (τ = 0) to α_max (τ = P − 1)."""
    if period < 2:
        raise ValueError(f"an α cycle needs at least 2 rounds, got a period of {period}")
    if not 0 <= tau < period:
        raise ValueError(f"round {tau} is outside a cycle of {period} rounds")
    if tau == period - 1:
        return alpha_max  # exactly: the peak rule compares with it
    return alpha_min + 0.5 * (alpha_max - alpha_min) * (1 - math.cos(math.pi * tau / (period - 1)))


def alpha_at(round_: int, period: int, growth: int, alpha_min: float, alpha_max: float) -> float:
    """α^(t) from the round alone (the closed form of handing :class:`CycleState` on from round 0)."""
    cycle = CycleState(0, period).at(round_, growth)
    return cyclic_alpha(round_ - cycle.start, cycle.period, alpha_min, alpha_max)


def peak_threshold(cycle: CycleState, updates: int, alpha_min: float, alpha_max: float) -> float:
    """α_k: the ``updates``-th largest α of ``cycle`` (α_max for 1; α_min if the cycle is that short)."""
    if updates < 1:
        raise ValueError("at least one peak update per cycle")
    if updates >= cycle.period:
        return alpha_min
    return cyclic_alpha(cycle.period - updates, cycle.period, alpha_min, alpha_max)


def peak_updates(fleet: int, senders: int) -> int:
    """A.4.6: how many of a cycle's largest α values update peak models: 1 with 50 % senders or more,
    else ⌈N / (2|S|)⌉ (10 % senders: 5, the paper's example)."""
    if 2 * senders >= fleet:
        return 1
    return math.ceil(fleet / (2 * senders))


def updates_peak(alpha: float, alpha_n: float, threshold: float) -> bool:
    """Whether a participant that got a model aggregated with ``alpha`` copies it into its peak model."""
    return alpha >= min(alpha_n, threshold)


# ----------------------------------------------------------------------------------------- training

def weighted_mutual_learning(models: Sequence[nn.Module], data: ArrayDataset, params: SgdParams, alpha: float,
                             generator: torch.Generator, supervise: Supervision,
                             distance: Distance | None = None, privacy: PrivateSteps | None = None) -> bool:
    """003 Alg. 1, aggregator side: ``params.epochs`` (K) passes over the aggregator's ``data``; on every
    batch all models' logits, then one simultaneous step of each on its eq.-1 loss. With ``privacy`` each step is
    DP-SGD of every model (:mod:`dfl_node.learning.privacy`). Returns whether the models trained: False where the
    privacy budget refused the passes, which then changed none."""
    counts = [sum(p.numel() for p in m.parameters() if p.requires_grad) for m in models]
    optimizers = [sgd(m, params) for m in models]
    for model in models:
        model.train()
    if privacy is not None:
        return privacy.train(models, optimizers, data, params, generator, lambda outputs, y: torch.stack(
            dfml_losses(outputs, y, alpha, counts, supervise, distance)).sum()) is not None
    for _ in range(params.epochs):
        for x, y in shuffled_batches(data, params.batch_size, generator):
            losses = dfml_losses([m(x) for m in models], y, alpha, counts, supervise, distance)
            for optimizer in optimizers:
                optimizer.zero_grad()
            torch.stack(losses).sum().backward()  # the graphs are disjoint: each loss reaches its own model
            for optimizer in optimizers:
                optimizer.step()
    release(*optimizers)
    return True


def deep_mutual_learning(local: nn.Module, meme: nn.Module, data: ArrayDataset, params: SgdParams, alpha: float,
                         beta: float, generator: torch.Generator, supervise: Supervision = F.cross_entropy,
                         distance: Distance | None = None, privacy: PrivateSteps | None = None) -> bool:
    """004 Alg. 1 ClientUpdate: ``params.epochs`` passes of DML between the local and the meme model (eq. 3). With
    ``privacy`` each step is DP-SGD of both (:mod:`dfl_node.learning.privacy`). Returns whether they trained: False
    where the privacy budget refused the passes, which then changed neither."""
    local.train()
    meme.train()
    opt_local, opt_meme = sgd(local, params), sgd(meme, params)
    if privacy is not None:
        return privacy.train([local, meme], [opt_local, opt_meme], data, params, generator, lambda out, y: torch.stack(
            fml_losses(out[0], out[1], y, alpha, beta, supervise, distance)).sum()) is not None
    for _ in range(params.epochs):
        for x, y in shuffled_batches(data, params.batch_size, generator):
            loss_local, loss_meme = fml_losses(local(x), meme(x), y, alpha, beta, supervise, distance)
            opt_local.zero_grad()
            opt_meme.zero_grad()
            (loss_local + loss_meme).backward()
            opt_local.step()
            opt_meme.step()
    release(opt_local, opt_meme)
    return True
