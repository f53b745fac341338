"""Robust fusion: what a receiver can bound in the models its peers send, as plain functions over tensors.

A member with valid credentials can send a finite, well-formed, poisoned model; these are the bounds a receiver
puts on it (the defences of :mod:`dfl_node.algorithms.defences` call them):

* :func:`robust_average` — coordinate-wise median and trimmed mean (Yin et al. 2018) of a group's models, in
  place of the sample-weighted mean: one model far off in any coordinate moves neither, and neither reads the
  sample counts the senders claim.
* :func:`relative_distance` — how far a received model (or segment) lies from the receiver's own, relative to
  the receiver's own norm, over the elements it carries: the norm bound. Relative, because a model's scale
  depends on its architecture and its training; the receiver's own model is the one reference it can trust.
* :func:`capped_count` — a claimed sample count bounded by a multiple of the receiver's own: a node cannot
  verify what a peer says it holds, only refuse to let one claim outweigh everything else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from dfl_node.learning.fusion import average_states
from dfl_node.learning.tensors import StateDict, TensorPart

Aggregation = Literal["mean", "median", "trimmed-mean"]


def robust_average(states: Sequence[StateDict], rule: Literal["median", "trimmed-mean"], trim: float) -> StateDict:
    """The coordinate-wise ``median`` (the mean of the two middle values for an even count) or ``trimmed-mean``
    (the mean of what is left once ``floor(trim · n)`` values are cut at each end, ``0 ≤ trim < 0.5``) of
    ``states``; integer entries are the first state's, as :func:`~dfl_node.learning.fusion.average_states` keeps
    them. Of two models either rule is their plain (unweighted) mean."""
    if not states:
        raise ValueError("nothing to aggregate")
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim {trim} is outside [0, 0.5)")
    n = len(states)
    cut = math.floor(trim * n) if rule == "trimmed-mean" else 0
    fused: StateDict = {}
    with torch.no_grad():
        for name, first in states[0].items():
            if not first.is_floating_point():
                fused[name] = first.detach().clone()
                continue
            ordered = torch.stack([s[name].detach().to(first.device) for s in states]).sort(dim=0).values
            if rule == "median":
                value = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
            else:
                value = ordered[cut : n - cut].mean(dim=0)
            fused[name] = value.to(first.dtype)
    return fused


def aggregate_states(states: Sequence[StateDict], weights: Sequence[float], rule: Aggregation,
                     trim: float) -> StateDict:
    """A group's models combined by ``rule``: ``mean`` is the sample-weighted mean (003 eq. 5), bit for bit
    :func:`~dfl_node.learning.fusion.average_states`; ``median`` and ``trimmed-mean`` ignore ``weights``."""
    if rule == "mean":
        return average_states(states, weights)
    return robust_average(states, rule, trim)


def relative_distance(own: Mapping[str, torch.Tensor], parts: Sequence[TensorPart]) -> float | None:
    """‖received − own‖ / ‖own‖ over the floating-point elements ``parts`` carry (whole tensors or ranges of
    them), in float64; None where no part fits ``own`` (another architecture: nothing to compare with). A
    receiver whose own elements are all zero measures the received ones' norm against 1."""
    squared_gap, squared_own = 0.0, 0.0
    compared = False
    for part in parts:
        mine = own.get(part.name)
        if mine is None or tuple(mine.shape) != part.shape or not mine.is_floating_point():
            continue
        stop = part.start + part.values.numel()
        if stop > mine.numel():
            continue
        reference = mine.detach().reshape(-1)[part.start : stop].to(torch.float64)
        received = part.values.detach().to(reference.device, torch.float64)
        squared_gap += float((received - reference).pow(2).sum())
        squared_own += float(reference.pow(2).sum())
        compared = True
    if not compared:
        return None
    return math.sqrt(squared_gap) / (math.sqrt(squared_own) or 1.0)


def capped_count(claimed: int, own: int, cap: float) -> int:
    """A peer's claimed sample count, at most ``cap`` times the receiver's own (at least 1: a weight of 0 would
    leave an average of nothing), never below 0."""
    return max(0, min(claimed, max(1, math.floor(cap * own))))
