"""Local training and evaluation: the SGD_{B,M} of 000 eq. 1, and accuracy/loss on a dataset.

Randomness (minibatch order) comes only from the ``generator`` argument, so a driver that passes
the same generator state gets bit-identical models — the simulator and the daemon rely on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.learning.datasets import ArrayDataset


@dataclass(frozen=True)
class SgdParams:
    """Optimiser settings of one local update (000 §IV.D: lr 0.01, momentum 0.5, batch 200)."""

    lr: float
    momentum: float
    batch_size: int
    epochs: int


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    loss: float
    samples: int


def minibatches(num_samples: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of one shuffled pass over the data (the last batch may be smaller)."""
    order = torch.randperm(num_samples, generator=generator)
    yield from order.split(batch_size)


def sgd(model: nn.Module, params: SgdParams) -> torch.optim.Optimizer:
    """A fresh optimiser per update: momentum buffers do not outlive a round, as in the papers' code."""
    return torch.optim.SGD(model.parameters(), lr=params.lr, momentum=params.momentum)


def local_sgd(model: nn.Module, data: ArrayDataset, params: SgdParams, generator: torch.Generator,
              proximal_mu: float = 0.0) -> float:
    """Train ``model`` in place for ``params.epochs`` passes with cross-entropy; returns the mean batch loss.

    ``proximal_mu`` > 0 adds FedProx's term μ/2·‖w − w_start‖² (003 Alg. 2), ``w_start`` being the
    model as this update began (decentralized FedProx treats it as the global model): its gradient
    μ·(w − w_start) is added to each step's gradient, and its value is left out of the returned loss.
    """
    model.train()
    optimizer = sgd(model, params)
    anchors = [p.detach().clone() for p in model.parameters()] if proximal_mu else []
    total, steps = 0.0, 0
    for _ in range(params.epochs):
        for idx in minibatches(len(data), params.batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(data.x[idx]), data.y[idx])
            loss.backward()
            for param, anchor in zip(model.parameters(), anchors):
                if param.grad is not None:
                    param.grad.add_(param.detach() - anchor, alpha=proximal_mu)
            optimizer.step()
            total += loss.item()
            steps += 1
    return total / max(steps, 1)


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayDataset, batch_size: int = 2048) -> Evaluation:
    """Accuracy and mean cross-entropy of ``model`` on ``data``."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    n = max(len(data), 1)
    return Evaluation(accuracy=correct / n, loss=loss_sum / n, samples=len(data))
