"""The algorithm protocol: roles and messages, no I/O (design §1).

A round of every algorithm of this family is: the planner picks pairings (sender → receiver);
each sender runs :meth:`Algorithm.sender_step` and transmits the message it returns; the
receiver runs :meth:`Algorithm.receiver_step`, which may return a reply (Combo's other segment);
the sender then runs :meth:`Algorithm.sender_finish` on that reply. The simulator calls these
with an in-memory hand-over, the daemon with gRPC streams; because every random choice is drawn
from :func:`derive_seed` of (seed, round, node, purpose), both drivers produce the same models.
"""

from __future__ import annotations

import copy
import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.config import LearningConfig
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.training import SgdParams, local_sgd


def derive_seed(*keys: object) -> int:
    """A 63-bit seed from any keys: stable across processes and machines (unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(map(str, keys)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def generator_for(*keys: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*keys))


@dataclass
class NodeContext:
    """What an algorithm may read and change on one node: its model and its private data."""

    node_id: str
    model: nn.Module
    train: ArrayDataset
    val: ArrayDataset
    config: LearningConfig

    @property
    def num_samples(self) -> int:
        """N_k of eq. 9: the number of *training* samples (after the 80/20 split)."""
        return len(self.train)

    def local_params(self) -> SgdParams:
        c = self.config
        return SgdParams(lr=c.lr, momentum=c.momentum, batch_size=c.batch_size, epochs=c.local_epochs)

    def mkt_params(self) -> SgdParams:
        c = self.config
        return SgdParams(lr=c.mkt_lr or c.lr, momentum=c.momentum, batch_size=c.mkt_batch_size, epochs=c.mkt_epochs)

    def trained_copy(self, round_: int) -> nn.Module:
        """SGD_{B1,M}(w, D) of 000 eq. 1 on a copy; minibatch order from (seed, round, node)."""
        model = copy.deepcopy(self.model)
        local_sgd(model, self.train, self.local_params(), generator_for(self.config.seed, round_, self.node_id, "local"))
        return model


@dataclass(frozen=True)
class Pairing:
    sender: str
    receiver: str


@dataclass(frozen=True)
class RoundPlan:
    round: int
    pairings: tuple[Pairing, ...]


class AlgorithmError(ValueError):
    """A message an algorithm cannot fuse (wrong purpose, wrong segments, wrong shapes)."""


class Algorithm(ABC):
    """One decentralized algorithm as a protocol of roles. Subclasses hold no per-node state."""

    name: ClassVar[str]
    sender_keeps_trained_default: ClassVar[bool] = False
    replies: ClassVar[bool] = False  # whether receiver_step returns a message for the sender (Combo)

    def __init__(self, config: LearningConfig) -> None:
        self.config = config

    @property
    def sender_keeps_trained(self) -> bool:
        keep = self.config.sender_keeps_trained
        return self.sender_keeps_trained_default if keep is None else keep

    def plan_round(self, round_: int, peers: Sequence[str]) -> RoundPlan:
        """000 Alg. 1: disjoint random sets I_A (senders) and I_B (receivers) of size Q from the live peers."""
        q = self.config.pairs
        members = sorted(peers)
        if len(members) < 2 * q:
            raise ValueError(f"round {round_} needs {2 * q} nodes for Q={q}, only {len(members)} available")
        chosen = random.Random(derive_seed(self.config.seed, round_, "plan")).sample(members, 2 * q)
        return RoundPlan(round_, tuple(Pairing(s, r) for s, r in zip(chosen[:q], chosen[q:])))

    @abstractmethod
    def sender_step(self, ctx: NodeContext, round_: int) -> ModelMessage:
        """Train (as the algorithm says) and return what to transmit."""

    @abstractmethod
    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        """Raise :class:`AlgorithmError` unless :meth:`receiver_step` can fuse ``message``.

        A node calls it before it accepts a transfer, so a sender is told "no" rather than told
        "yes" for a model that is then dropped; ``receiver_step`` calls it too.
        """

    @abstractmethod
    def receiver_step(self, ctx: NodeContext, message: ModelMessage) -> ModelMessage | None:
        """Fuse the received message into ``ctx.model``; return a reply, if the algorithm sends one back."""

    def sender_finish(self, ctx: NodeContext, reply: ModelMessage | None) -> None:
        """Use the receiver's reply (only Combo has one)."""
        if reply is not None:
            raise AlgorithmError(f"{self.name} expects no reply, got {reply.purpose!r}")

    def check_purpose(self, message: ModelMessage, expected: str) -> None:
        if message.purpose != expected:
            raise AlgorithmError(f"{self.name} cannot fuse a {message.purpose!r} message (expects {expected!r})")
