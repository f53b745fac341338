"""Local training and evaluation: the SGD_{B,M} of 000 eq. 1, and accuracy/loss on a dataset.

Randomness (minibatch order) comes only from the ``generator`` argument, so a driver that passes
the same generator state gets bit-identical models — the simulator and the daemon rely on it.

The inner loop does nothing but forward, backward and step: batches are gathered with
``index_select`` (a row copy; ``data.x[idx]``'s advanced indexing took 5× as long on 000's MNIST
shards), the optimiser is our own few lines (:class:`Sgd`: ``torch.optim``'s loads a compiler), and losses
are summed on the device and read once per update. None of it changes a value: the batches, the arithmetic
and its order are those of a per-batch ``data.x[idx]``, a fresh ``torch.optim.SGD`` and ``loss.item()``.

One pass over the data is an ordinary function, :func:`local_epoch`, over an index order given as a tensor: the
eager loop calls it once per epoch, and on CUDA :mod:`dfl_node.learning.cuda_graphs` captures the same function
in a CUDA graph and replays it (``SgdParams.cuda_graphs``), so what runs on the GPU is the code the CPU tests hold
to the plain loop's bits.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.learning import work
from dfl_node.learning.cuda_graphs import CudaGraphRecorder, EpochGraph, Recorder, graph_for, orders
from dfl_node.learning.datasets import ArrayDataset

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (outputs, targets) -> mean loss


class PrivateSteps(Protocol):
    """What training asks of a node's differential privacy (:class:`~dfl_node.learning.privacy.PrivateTraining`,
    which builds on this module: named here by what it does, so that neither module imports the other both ways)."""

    def train(self, models: Sequence[nn.Module], optimizers: Sequence[Sgd], data: ArrayDataset, params: SgdParams,
              generator: torch.Generator, loss_of: Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor],
              before_step: Callable[[], None] | None = None) -> float | None: ...


@dataclass(frozen=True)
class SgdParams:
    """Optimiser settings of one local update (000 §IV.D: lr 0.01, momentum 0.5, batch 200), and how it runs:
    ``cuda_graphs`` replays each epoch as a captured CUDA graph where the data is on CUDA (no effect elsewhere);
    ``bf16`` runs forward passes under bfloat16 autocast (the ``precision`` setting ``bf16``; off: float32)."""

    lr: float
    momentum: float
    batch_size: int
    epochs: int
    cuda_graphs: bool = False
    bf16: bool = False


@dataclass(frozen=True)
class Evaluation:
    """A model judged on a dataset: ``score``, its task's headline metric (:mod:`.tasks`; classification's
    accuracy), the mean loss, and every metric the task reports by name."""

    score: float
    loss: float
    samples: int
    metrics: Mapping[str, float] = field(default_factory=dict)


def minibatches(num_samples: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of one shuffled pass over the data (the last batch may be smaller)."""
    order = torch.randperm(num_samples, generator=generator)
    yield from order.split(batch_size)


def batches_per_epoch(num_samples: int, batch_size: int) -> int:
    return math.ceil(num_samples / batch_size)


def epoch_order(data: ArrayDataset, generator: torch.Generator) -> torch.Tensor:
    """One pass's permutation of ``data``'s rows: drawn on the CPU ``generator`` (so every device sees the same
    order) and moved to the data's device once per pass."""
    return torch.randperm(len(data), generator=generator).to(data.x.device)


def gather(data: ArrayDataset, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch at row indices ``idx``, gathered just before it is used. (Gathering the whole shard once per
    pass and slicing it was slower on a CPU: the shuffled copy falls out of cache before its batches are read.)"""
    return data.x.index_select(0, idx), data.y.index_select(0, idx)


def shuffled_batches(data: ArrayDataset, batch_size: int,
                     generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(x, y)`` batches of one pass in :func:`epoch_order`, each counted as a step."""
    for idx in epoch_order(data, generator).split(batch_size):
        work.done().steps += 1
        yield gather(data, idx)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[object]:
    """bfloat16 autocast on ``device`` for ``bf16`` (the ``precision`` setting), else nothing: float32. Without
    autocast's weight cache: a step casts each weight once anyway, and a CUDA graph's capture must not keep one."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


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


def local_epoch(model: nn.Module, data: ArrayDataset, order: torch.Tensor, batch_size: int, optimizer: Sgd,
                total: torch.Tensor, loss_fn: LossFn = F.cross_entropy, bf16: bool = False,
                anchors: list[torch.Tensor] | None = None, proximal_mu: float = 0.0) -> None:
    """One pass of SGD over ``data`` in ``order`` (row indices on the data's device), each batch's loss added to
    ``total``: the body of :func:`local_sgd`, run eagerly there and captured as a CUDA graph by
    :mod:`dfl_node.learning.cuda_graphs` — so it never reads a value back to the host, and changes no Python
    state but the models', the optimiser's tensors and ``total`` (work is counted by the callers)."""
    for idx in order.split(batch_size):
        x, y = gather(data, idx)
        optimizer.zero_grad()
        with autocast(x.device, bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        proximal_gradient_(model, anchors or [], proximal_mu)
        optimizer.step()
        total += loss.detach()


def proximal_gradient_(model: nn.Module, anchors: list[torch.Tensor], proximal_mu: float) -> None:
    """FedProx's gradient μ·(w − w_start) added to each of ``model``'s gradients (``anchors``: w_start)."""
    for param, anchor in zip(model.parameters(), anchors):
        if param.grad is not None:
            param.grad.add_(param.detach() - anchor, alpha=proximal_mu)


def local_sgd(model: nn.Module, data: ArrayDataset, params: SgdParams, generator: torch.Generator,
              proximal_mu: float = 0.0, loss_fn: LossFn = F.cross_entropy,
              privacy: PrivateSteps | None = None) -> float | None:
    """Train ``model`` in place for ``params.epochs`` passes with ``loss_fn`` (cross-entropy; 003's WSM is
    :func:`dfl_node.learning.mutual.wsm_loss`); returns the mean batch loss.

    ``proximal_mu`` > 0 adds FedProx's term μ/2·‖w − w_start‖² (003 Alg. 2), ``w_start`` being the
    model as this update began (decentralized FedProx treats it as the global model): its gradient
    μ·(w − w_start) is added to each step's gradient, and its value is left out of the returned loss.

    With ``params.cuda_graphs`` and the data on CUDA, plain cross-entropy training replays each epoch as a
    CUDA graph (:func:`graphed_local_sgd`): the same epochs, one launch each.

    With ``privacy`` (the node's differential privacy, :mod:`dfl_node.learning.privacy`) every step is DP-SGD
    (the proximal term added after the noise: it reads no data), never graphed; None where its budget refused the
    update, which then left the model as it was.
    """
    model.train()
    if privacy is not None:
        anchors = [p.detach().clone() for p in model.parameters()] if proximal_mu else []
        return privacy.train([model], [sgd(model, params)], data, params, generator,
                             lambda outputs, y: loss_fn(outputs[0], y),
                             lambda: proximal_gradient_(model, anchors, proximal_mu))
    if params.cuda_graphs and data.x.is_cuda and not proximal_mu and loss_fn is F.cross_entropy:
        loss = graphed_local_sgd(model, data, params, generator)
        if loss is not None:
            return loss
    optimizer = sgd(model, params)
    anchors = [p.detach().clone() for p in model.parameters()] if proximal_mu else []
    total = torch.zeros((), dtype=torch.float64, device=data.x.device)
    steps = batches_per_epoch(len(data), params.batch_size)
    for _ in range(params.epochs):
        order = epoch_order(data, generator)
        work.done().steps += steps
        local_epoch(model, data, order, params.batch_size, optimizer, total, loss_fn, params.bf16, anchors,
                    proximal_mu)
    release(optimizer)
    return float(total) / max(steps * params.epochs, 1)


def graphed_local_sgd(model: nn.Module, data: ArrayDataset, params: SgdParams, generator: torch.Generator,
                      recorder: Callable[[], Recorder] = CudaGraphRecorder) -> float | None:
    """:func:`local_sgd` (cross-entropy, no proximal term) with each epoch a replay of :func:`local_epoch`'s graph
    (:mod:`dfl_node.learning.cuda_graphs`); None, having drawn nothing from ``generator``, where the model cannot be
    captured."""
    def build() -> EpochGraph:
        optimizer = sgd(model, params)

        def body(order: torch.Tensor, total: torch.Tensor) -> None:
            local_epoch(model, data, order, params.batch_size, optimizer, total, bf16=params.bf16)
        return EpochGraph([model], [optimizer], data, body, recorder())

    settings = (params.lr, params.momentum, params.batch_size, params.bf16)
    graph = graph_for("local", [model], data, settings, build, recorder)
    if graph is None:
        return None
    steps = batches_per_epoch(len(data), params.batch_size) * params.epochs
    work.done().steps += steps
    graph.run(orders(data, generator, params.epochs))
    return float(graph.total) / steps


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayDataset, batch_size: int = 2048) -> Evaluation:
    """Accuracy and mean cross-entropy of ``model`` on ``data``, in float32 whatever the ``precision``. The sums
    stay on the device and are read once (on a GPU a read per batch waited for each batch): in float64, which
    adds each batch's float32 loss as a Python float would, so the figures are those of a read per batch."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=data.x.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=data.x.device)
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    n = max(len(data), 1)
    work.done().samples_evaluated += len(data)
    accuracy = int(correct) / n
    return Evaluation(score=accuracy, loss=float(loss_sum) / n, samples=len(data), metrics={"accuracy": accuracy})
