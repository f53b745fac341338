"""Local training and evaluation: the SGD_{B,M} of 000 eq. 1, and accuracy/loss on a dataset.

Randomness (minibatch order) comes only from the ``generator`` argument, so a driver that passes
the same generator state gets bit-identical models — the simulator and the daemon rely on it.

The inner loop does nothing but forward, backward and step: batches are gathered with
``index_select`` (a row copy; ``data.x[idx]``'s advanced indexing took 5× as long on 000's MNIST
shards), the optimiser is our own few lines (:class:`Sgd`: ``torch.optim``'s loads a compiler), and losses
are summed on the device and read once per update. None of it changes a value: the batches, the arithmetic
and its order are those of a per-batch ``data.x[idx]``, a fresh ``torch.optim.SGD`` and ``loss.item()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.learning import work
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


def shuffled_batches(data: ArrayDataset, batch_size: int,
                     generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(x, y)`` batches of :func:`minibatches`' order. The permutation is drawn on the CPU
    ``generator`` as there (so every device sees the same order) and moved to the data's device once
    per pass; each batch is gathered just before it is used. (Gathering the whole shard once per pass
    and slicing it was slower on a CPU: the shuffled copy falls out of cache before its batches are read.)"""
    order = torch.randperm(len(data), generator=generator).to(data.x.device)
    for idx in order.split(batch_size):
        work.DONE.steps += 1
        yield data.x.index_select(0, idx), data.y.index_select(0, idx)


class Sgd:
    """SGD with momentum over ``parameters`` for one update: the arithmetic of ``torch.optim.SGD`` (no dampening,
    weight decay or Nesterov; the momentum buffer starts as the first gradient), whose CPU steps are these
    ``foreach`` calls one tensor at a time, and whose other devices run them as they are here. A momentum buffer
    does not outlive its update, as in the papers' code.

    Why not ``torch.optim.SGD`` itself: its constructor imports ``torch._dynamo`` on first use, 1.15 s and 73 MB
    of RSS in every process that trains (a daemon, each restart of it), for a compiler a node never runs.
    ``tests/test_inner_loop.py`` holds the two to the same bits."""

    def __init__(self, parameters: list[torch.Tensor], params: SgdParams) -> None:
        self.parameters, self.lr, self.momentum = parameters, params.lr, params.momentum
        self.buffers: list[torch.Tensor] | None = None

    def zero_grad(self) -> None:
        """Drop the gradients (``torch.optim``'s ``zero_grad(set_to_none=True)``)."""
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        stepped = [p for p in self.parameters if p.grad is not None]
        grads = [g for p in stepped if (g := p.grad) is not None]
        if self.momentum:
            if self.buffers is None:
                self.buffers = [g.detach().clone() for g in grads]
            else:
                torch._foreach_mul_(self.buffers, self.momentum)
                torch._foreach_add_(self.buffers, grads)
            grads = self.buffers
        torch._foreach_add_(stepped, grads, alpha=-self.lr)


def sgd(model: nn.Module, params: SgdParams) -> Sgd:
    """``model``'s SGD for one update (:class:`Sgd`)."""
    return Sgd(list(model.parameters()), params)


def release(*optimizers: Sgd) -> None:
    """End of an update: free the gradients and momentum buffers now rather than at the next update. The
    math is the same (they never outlive an update); the memory is not: a node that trained would else
    hold two more copies of its model while it receives and aggregates others (benchmarks/aggregator.py)."""
    for optimizer in optimizers:
        optimizer.zero_grad()
        optimizer.buffers = None


def local_sgd(model: nn.Module, data: ArrayDataset, params: SgdParams, generator: torch.Generator,
              proximal_mu: float = 0.0, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
              ) -> float:
    """Train ``model`` in place for ``params.epochs`` passes with ``loss_fn`` (cross-entropy; 003's WSM is
    :func:`dfl_node.learning.mutual.wsm_loss`); returns the mean batch loss.

    ``proximal_mu`` > 0 adds FedProx's term μ/2·‖w − w_start‖² (003 Alg. 2), ``w_start`` being the
    model as this update began (decentralized FedProx treats it as the global model): its gradient
    μ·(w − w_start) is added to each step's gradient, and its value is left out of the returned loss.
    """
    model.train()
    optimizer = sgd(model, params)
    anchors = [p.detach().clone() for p in model.parameters()] if proximal_mu else []
    total, steps = torch.zeros((), dtype=torch.float64, device=data.x.device), 0
    for _ in range(params.epochs):
        for x, y in shuffled_batches(data, params.batch_size, generator):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            for param, anchor in zip(model.parameters(), anchors):
                if param.grad is not None:
                    param.grad.add_(param.detach() - anchor, alpha=proximal_mu)
            optimizer.step()
            total += loss.detach()
            steps += 1
    release(optimizer)
    return float(total) / max(steps, 1)


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
    work.DONE.samples_evaluated += len(data)
    return Evaluation(accuracy=correct / n, loss=loss_sum / n, samples=len(data))
