"""The papers' fusion formulas as functions over models, state dicts and batches (the averages work in place).

* :func:`mutual_knowledge_transfer` — 000 eqs. 2–8 (MKT of Def-KT).
* :func:`weighted_average_` — 000 eq. 9 (FullAvg), sample-count weights, in place.
* :func:`average_states` — 003 eq. 5 (decentralized FedAvg/FedProx): the weighted mean of many models.
* :func:`segment_ranges`, :func:`segment_parts`, :func:`average_parts_` — Combo's segment averaging.

Where the papers leave a detail open, it is decided here, once:

* MKT losses: ``Loss1 = CE(P1, Y) + KL(P2 ‖ P1)`` and ``Loss2 = CE(P2, Y) + KL(P1 ‖ P2)``, the other
  model's prediction a constant target, KL averaged over the batch (``batchmean``) like CE.
* MKT step order: both predictions are computed on the batch first, then both models step
  (a simultaneous step). Each model has its own optimizer.
* Segments: the *flattened vector of floating-point state entries* (parameters and float buffers,
  in state-dict order) is cut into S contiguous pieces of nearly equal size (boundaries
  ``floor(i·T/S)``). Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) belong to no
  segment and are never averaged: each node keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.learning import work
from dfl_node.learning.cuda_graphs import CudaGraphRecorder, EpochGraph, Recorder, graph_for, orders
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.tensors import StateDict, TensorPart
from dfl_node.learning.training import (
    PrivateSteps,
    Sgd,
    SgdParams,
    autocast,
    batches_per_epoch,
    epoch_order,
    gather,
    release,
    sgd,
)

SegmentRange = tuple[str, int, int]  # tensor name, start, stop (flattened element offsets)
# (received's outputs, local's outputs, targets) -> each model's loss: a task's (dfl_node.learning.tasks)
MutualLosses = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def mkt_losses(
    logits_received: torch.Tensor, logits_local: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """000 eqs. 5–6: each model's CE on the labels plus KL from the other's (detached) prediction."""
    log_p1 = F.log_softmax(logits_received, dim=1)
    log_p2 = F.log_softmax(logits_local, dim=1)
    loss1 = F.nll_loss(log_p1, labels) + F.kl_div(log_p1, log_p2.detach(), reduction="batchmean", log_target=True)
    loss2 = F.nll_loss(log_p2, labels) + F.kl_div(log_p2, log_p1.detach(), reduction="batchmean", log_target=True)
    return loss1, loss2


def mutual_knowledge_transfer(
    received: nn.Module,
    local: nn.Module,
    data: ArrayDataset,
    received_params: SgdParams,
    local_params: SgdParams,
    generator: torch.Generator,
    losses: MutualLosses = mkt_losses,
    privacy: PrivateSteps | None = None,
) -> bool:
    """000 Alg. 1, receiver side: E passes of simultaneous MKT steps (eqs. 2–3) on the receiver's data.

    Both models are updated in place; the caller keeps ``received`` as the new local model. ``losses`` are
    000's eqs. 5–6 (CE + KL) or another task's supervision and distillation (:mod:`dfl_node.learning.tasks`).
    ``received_params.epochs`` (E) and ``.batch_size`` (B2) drive the passes; with its ``cuda_graphs`` and the
    data on CUDA each pass is a CUDA graph's replay (:func:`graphed_mkt`). With ``privacy`` each step is DP-SGD of
    both models (:mod:`dfl_node.learning.privacy`). Returns whether the models trained: False where the privacy
    budget refused the passes, which then changed neither.
    """
    received.train()
    local.train()
    if privacy is not None:
        return privacy.train([received, local], [sgd(received, received_params), sgd(local, local_params)], data,
                             received_params, generator,
                             lambda out, y: torch.stack(losses(out[0], out[1], y)).sum()) is not None
    if received_params.cuda_graphs and data.x.is_cuda and graphed_mkt(received, local, data, received_params,
                                                                        local_params, generator, losses=losses):
        return True
    opt_received, opt_local = sgd(received, received_params), sgd(local, local_params)
    steps = batches_per_epoch(len(data), received_params.batch_size)
    for _ in range(received_params.epochs):
        order = epoch_order(data, generator)
        work.done().steps += steps
        mkt_epoch(received, local, data, order, received_params.batch_size, opt_received, opt_local,
                  received_params.bf16, losses)
    release(opt_received, opt_local)
    return True


def mkt_epoch(received: nn.Module, local: nn.Module, data: ArrayDataset, order: torch.Tensor, batch_size: int,
              opt_received: Sgd, opt_local: Sgd, bf16: bool = False, losses: MutualLosses = mkt_losses) -> None:
    """One pass of simultaneous MKT steps over ``data`` in ``order``: the body of
    :func:`mutual_knowledge_transfer`, run eagerly there and captured as a CUDA graph by
    :mod:`dfl_node.learning.cuda_graphs` (no host reads, no Python state changed but the tensors')."""
    for idx in order.split(batch_size):
        x, y = gather(data, idx)
        with autocast(x.device, bf16):
            loss1, loss2 = losses(received(x), local(x), y)
        opt_received.zero_grad()
        opt_local.zero_grad()
        (loss1 + loss2).backward()  # the graphs are disjoint: each loss reaches only its own model
        opt_received.step()
        opt_local.step()


def graphed_mkt(received: nn.Module, local: nn.Module, data: ArrayDataset, received_params: SgdParams,
                local_params: SgdParams, generator: torch.Generator,
                recorder: Callable[[], Recorder] = CudaGraphRecorder, losses: MutualLosses = mkt_losses) -> bool:
    """:func:`mutual_knowledge_transfer` with each epoch a replay of :func:`mkt_epoch`'s graph
    (:mod:`dfl_node.learning.cuda_graphs`); False, having drawn nothing from ``generator``, where the models cannot
    be captured."""
    def build() -> EpochGraph:
        optimizers = sgd(received, received_params), sgd(local, local_params)

        def body(order: torch.Tensor, total: torch.Tensor) -> None:
            mkt_epoch(received, local, data, order, received_params.batch_size, *optimizers, received_params.bf16,
                      losses)
        return EpochGraph([received, local], optimizers, data, body, recorder())

    settings = (*((p.lr, p.momentum, p.batch_size, p.bf16) for p in (received_params, local_params)), losses)
    graph = graph_for("mkt", [received, local], data, settings, build, recorder)
    if graph is None:
        return False
    work.done().steps += batches_per_epoch(len(data), received_params.batch_size) * received_params.epochs
    graph.run(orders(data, generator, received_params.epochs))
    return True


def weighted_average_(local: StateDict, remote: StateDict, n_local: float, n_remote: float) -> None:
    """000 eq. 9, in place on ``local``: ``(N_r·w_r + N_l·w_l) / (N_r + N_l)`` for floating entries;
    integer buffers stay local. In place because models can be 100s of MB: a new state would cost an
    allocation (and page faults) the size of the model on every fusion."""
    if local.keys() != remote.keys():
        raise ValueError("cannot average models with different parameter names")
    for name, mine in local.items():
        if remote[name].shape != mine.shape:
            raise ValueError(f"shape mismatch for {name}: {tuple(remote[name].shape)} vs {tuple(mine.shape)}")
    w_remote = n_remote / (n_local + n_remote)
    with torch.no_grad():
        for name, mine in local.items():
            if mine.is_floating_point():
                mine.lerp_(remote[name].to(mine.device, mine.dtype), w_remote)  # mine + w·(theirs − mine), one pass


def average_states(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> StateDict:
    """003 eq. 5: ``Σ d_n·W_n / Σ d_n`` over same-architecture states, summed in the order given (callers
    sort by node id, so every driver rounds the same way). Integer buffers are taken from the first state."""
    if not states or len(states) != len(weights):
        raise ValueError("need one weight per state, and at least one state")
    names = list(states[0])
    for other in states[1:]:
        if list(other) != names or any(other[k].shape != states[0][k].shape for k in names):
            raise ValueError("cannot average models of different architectures")
    total = float(sum(weights))
    averaged: StateDict = {}
    with torch.no_grad():
        for name in names:
            first = states[0][name]
            if not first.is_floating_point():
                averaged[name] = first.detach().clone()
                continue
            dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
            acc = first.detach().to(dtype) * (weights[0] / total)
            for state, weight in zip(states[1:], weights[1:]):
                acc.add_(state[name].detach().to(acc.device), alpha=weight / total)
            averaged[name] = acc.to(first.dtype)
    return averaged


def segment_ranges(state: Mapping[str, torch.Tensor], count: int) -> list[list[SegmentRange]]:
    """Cut the flattened floating-point state into ``count`` contiguous, nearly equal segments."""
    if count < 1:
        raise ValueError("segment count must be >= 1")
    sizes = [(name, t.numel()) for name, t in state.items() if t.is_floating_point()]
    total = sum(n for _, n in sizes)
    bounds = [i * total // count for i in range(count + 1)]
    segments: list[list[SegmentRange]] = []
    for lo, hi in zip(bounds, bounds[1:]):
        pieces, offset = [], 0
        for name, n in sizes:
            start, stop = max(lo - offset, 0), min(hi - offset, n)
            if start < stop:
                pieces.append((name, start, stop))
            offset += n
        segments.append(pieces)
    return segments


def segment_parts(state: Mapping[str, torch.Tensor], indices: Sequence[int], count: int) -> tuple[TensorPart, ...]:
    """The values of segments ``indices`` (of ``count``) as transferable parts (copies)."""
    ranges = segment_ranges(state, count)
    return tuple(
        TensorPart(name, tuple(state[name].shape), start, state[name].detach().reshape(-1)[start:stop].clone())
        for i in indices
        for name, start, stop in ranges[i]
    )


def expected_ranges(state: Mapping[str, torch.Tensor], indices: Sequence[int], count: int) -> list[SegmentRange]:
    """The exact ranges a message carrying segments ``indices`` must hold (used to validate received parts)."""
    ranges = segment_ranges(state, count)
    return [r for i in indices for r in ranges[i]]


def average_parts_(local: StateDict, parts: Sequence[TensorPart], n_local: int, n_remote: int) -> None:
    """Eq. 9 in place on ``local``, applied only to the elements the parts carry; every other element
    keeps its local value. All parts are checked before anything is changed."""
    for part in parts:
        target = local.get(part.name)
        if target is None or tuple(target.shape) != part.shape or not target.is_floating_point():
            raise ValueError(f"part {part.name!r} does not fit the local model")
        if part.start + part.values.numel() > target.numel():
            raise ValueError(f"part {part.name!r} overruns the tensor")
    w_remote = n_remote / (n_local + n_remote)
    with torch.no_grad():
        for part in parts:
            flat = local[part.name].view(-1)
            flat[part.start : part.start + part.values.numel()].lerp_(part.values.to(flat.device, flat.dtype), w_remote)
