"""A step that changes a node's own models and leaves a NaN or ±Inf in them is caught, and undone, never kept.

The gate (:mod:`dfl_node.node.exchange.arrival_checks`) refuses received models that are not finite, but finite values
can still poison a computation: a peer's model scaled a millionfold is finite, and a knowledge transfer's KL on its huge
logits, or an average with its huge weights, is not. A node that kept that result would checkpoint it, fail to
verify its own checkpoints on restart, and be lost for good — one compromised member would destroy an honest one.
So every step that changes the node's models by computation (the aggregator's local step and fusion, a sender's
training and its update from a reply) runs under :func:`guarded`, which raises :class:`NonFinite` if the step left
any non-finite value in the model, the auxiliary models (DFML's peak, FML's meme), the scalars (DFML's α) or the
messages it built. The runner undoes it (:mod:`dfl_node.algorithms.runner`) and decides whom to blame: the
messages a fusion fused, or nobody (a node's own training diverged).

Undoing reads the node's durable checkpoint, which is the state its role began from, and replays the role's
earlier steps (deterministic: every random draw comes from the seed, the round and the node), rather than copying
the model before every step: that copy was a second model in memory for the whole of every fusion (a receiver's
peak rose from 1.2 to 2.2 times the model it received), for a result that is needed only when a step goes wrong.

A run whose every step stays finite computes exactly what it would without the guard: nothing is copied, and no
random number is drawn.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import ParamSpec, TypeVar

import torch

from dfl_node.algorithms.base import NodeContext
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.learning.tensors import all_finite, is_finite

NON_FINITE_RESULT = "non_finite_result"  # the reason a message is refused for when fusing or using it went non-finite
DIVERGED = "diverged"  # what a node's own training that went non-finite is counted as
REASONS = (NON_FINITE_RESULT, DIVERGED)
P = ParamSpec("P")
T = TypeVar("T")


class NonFinite(Exception):
    """A step left a non-finite value in the node's state or in what it returned; the message names the first such
    tensor (or scalar)."""


def guarded(ctx: NodeContext, step: Callable[P, T]) -> Callable[P, T]:
    """``step``, checked: :class:`NonFinite` where it leaves a NaN or ±Inf in ``ctx``'s models or scalars, or in the
    message(s) it returns (the caller undoes it: see the module's docstring). The wrapper keeps the step's name,
    which the node's transport times it by."""

    @functools.wraps(step)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        result = step(*args, **kwargs)
        bad = first_non_finite(ctx, _messages(result))
        if bad is not None:
            raise NonFinite(bad)
        return result

    return run


def first_non_finite(ctx: NodeContext, messages: Iterable[ModelMessage] = ()) -> str | None:
    """Where the first NaN or ±Inf is, in ``ctx``'s model, auxiliary models and scalars, then in ``messages``; None
    if there is none. One read pass per tensor and one value read back for them all (:func:`all_finite`): no
    model-sized temporary, and little time on a small model whose every step is checked."""
    floating = [(name, values) for name, values in _tensors(ctx, messages)
                if values.is_floating_point() and values.numel()]
    if not all_finite(values for _, values in floating):
        return next(name for name, values in floating if not is_finite(values))
    return next((f"scalar {name} = {value}" for name, value in ctx.scalars.items() if not math.isfinite(value)), None)


def _tensors(ctx: NodeContext, messages: Iterable[ModelMessage]) -> Iterator[tuple[str, torch.Tensor]]:
    yield from ctx.model.state_dict().items()
    for aux, model in ctx.auxiliary.items():
        yield from ((f"{aux}: {name}", values) for name, values in model.state_dict().items())
    for message in messages:
        yield from ((f"{message.purpose}: {p.name}", p.values) for p in message.parts)


def _messages(result: object) -> list[ModelMessage]:
    """The messages a role's step returned: ``transmit``'s one, ``aggregate``'s replies, none for the others."""
    if isinstance(result, ModelMessage):
        return [result]
    if isinstance(result, Mapping):
        return [m for m in result.values() if isinstance(m, ModelMessage)]
    return []
