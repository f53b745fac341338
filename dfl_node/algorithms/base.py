"""The algorithm protocol, v2: roles in groups and messages, no I/O.

A round is a :class:`~dfl_node.algorithms.plan.RoundPlan` of groups (senders → one aggregator).
In each group every sender runs :meth:`Algorithm.transmit` and its message goes to the aggregator
(pushed, or pulled by the aggregator for ``pulls`` algorithms); the aggregator runs
:meth:`Algorithm.local_step`, then :meth:`Algorithm.aggregate` over *all* the group's messages at
once — sorted by sender, so arrival order never matters — and may answer each sender, who runs
:meth:`Algorithm.finish` on its reply. :mod:`dfl_node.algorithms.runner` plays this sequence over a
node's transport, whose messages cross gRPC in a daemon and memory in the simulator. Every random choice is
drawn from :func:`derive_seed` of (seed, round, node, purpose), so both networks produce the same models.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from dfl_node.algorithms.messages import ModelMessage, TensorPart
from dfl_node.algorithms.plan import Group, NodeProfile, RoundPlan, Step
from dfl_node.learning.algorithm_settings import AlgorithmSettings, NoSettings, SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.privacy import PrivateTraining
from dfl_node.learning.tasks import Task, task_of
from dfl_node.learning.training import SgdParams, local_sgd


def derive_seed(*keys: object) -> int:
    """A 63-bit seed from any keys: stable across processes and machines (unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(map(str, keys)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def generator_for(*keys: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*keys))


@dataclass
class NodeContext:
    """What an algorithm may read and change on one node: its model, its architecture and its private data."""

    node_id: str
    model: nn.Module
    spec: ModelSpec
    train: ArrayDataset
    val: ArrayDataset
    config: SharedSettings
    _spares: dict[str, nn.Module] = field(default_factory=dict, repr=False, compare=False)
    # Models the algorithm keeps beside ``model`` (Algorithm.auxiliary_models: DFML's peak, FML's meme) and its
    # per-node scalars (DFML's α_n); both are checkpointed with the model, neither travels unless transmit sends it.
    auxiliary: dict[str, nn.Module] = field(default_factory=dict, repr=False, compare=False)
    scalars: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    # Differential privacy of every step on ``train`` (dfl_node.learning.privacy; None: off), the account with it
    privacy: PrivateTraining | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.train = self.task.supervised(self.train)

    @functools.cached_property
    def task(self) -> Task:
        """What the node learns (its ``task`` setting), one object for the node's life."""
        return task_of(self.config)

    @property
    def num_samples(self) -> int:
        """N_k of eq. 9: the number of *training* samples (after the 80/20 split)."""
        return len(self.train)

    def profile(self) -> NodeProfile:
        return NodeProfile(self.node_id, str(self.spec), self.num_samples)

    def use_data(self, train: ArrayDataset, val: ArrayDataset) -> None:
        """New training and validation sets (the node's data grew), from the next step on; the models stay."""
        self.train, self.val = self.task.supervised(train), val

    def local_params(self) -> SgdParams:
        c = self.config
        return SgdParams(lr=c.lr, momentum=c.momentum, batch_size=c.batch_size, epochs=c.local_epochs,
                         cuda_graphs=c.cuda_graphs, bf16=c.precision == "bf16")

    def mkt_params(self) -> SgdParams:
        c = self.config
        return SgdParams(lr=c.mkt_lr or c.lr, momentum=c.momentum, batch_size=c.mkt_batch_size, epochs=c.mkt_epochs,
                         cuda_graphs=c.cuda_graphs, bf16=c.precision == "bf16")

    def local_generator(self, round_: int) -> torch.Generator:
        """Minibatch order of this node's local training in ``round_``."""
        return generator_for(self.config.seed, round_, self.node_id, "local")

    def spare(self, slot: str) -> nn.Module:
        """A second model of this node's architecture, on its device, kept for ``slot`` and reused every
        round (a deep copy per round costs more than the copy of values callers make into it); its
        values are whatever the slot's last user left."""
        if slot not in self._spares:
            self._spares[slot] = copy.deepcopy(self.model)
        return self._spares[slot]

    def trained_copy(self, round_: int) -> nn.Module:
        """SGD_{B1,M}(w, D) of 000 eq. 1 on a copy; minibatch order from (seed, round, node).
        The copy is the node's ``trained`` spare: valid until the next call."""
        model = self.spare("trained")
        model.load_state_dict(self.model.state_dict())
        local_sgd(model, self.train, self.local_params(), self.local_generator(round_), loss_fn=self.task.loss,
                  privacy=self.privacy)
        return model

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The model's state plus the auxiliary models' (``aux:NAME:…``) and scalars (``scalar:NAME``, float64):
        one flat dict for a checkpoint file. Module names never hold a colon, so the prefixes cannot clash."""
        state = dict(self.model.state_dict())
        for name, model in self.auxiliary.items():
            state.update({f"aux:{name}:{key}": value for key, value in model.state_dict().items()})
        state.update({f"scalar:{name}": torch.tensor(value, dtype=torch.float64)
                      for name, value in self.scalars.items()})
        return state

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of :meth:`checkpoint_state`, in the form :meth:`restore_checkpoint` puts back: a checkpoint taken
        outside a role writes one, so that a role starting meanwhile cannot tear it. (A role that fails reads
        the model back from the newest checkpoint: :meth:`dfl_node.node.node.Node.restore_durable`.)"""
        return {name: tensor.detach().clone() for name, tensor in self.checkpoint_state().items()}

    def restore_checkpoint(self, state: dict[str, torch.Tensor], *, exact: bool = False) -> None:
        """Inverse of :meth:`checkpoint_state`; auxiliary models a checkpoint lacks keep their ``w0``, and scalars it
        lacks their values — unless ``exact`` (a state this node's own :meth:`checkpoint_state` wrote, which has all
        it had): then the scalars are the checkpoint's alone, and one a failed step added since goes."""
        self.model.load_state_dict(model_entries(state, None))
        for name, model in self.auxiliary.items():
            saved = model_entries(state, name)
            if saved:
                model.load_state_dict(saved)
        if exact:
            self.scalars.clear()
        self.scalars.update({key.removeprefix("scalar:"): float(v) for key, v in state.items()
                             if key.startswith("scalar:")})

    def message(self, round_: int, purpose: str, parts: tuple[TensorPart, ...], **metadata: str) -> ModelMessage:
        """A message from this node (its id, sample count and architecture filled in)."""
        return ModelMessage(sender=self.node_id, round=round_, purpose=purpose, num_samples=self.num_samples,
                            model=str(self.spec), parts=parts, metadata=dict(metadata))


def model_entries(state: Mapping[str, torch.Tensor], auxiliary: str | None) -> dict[str, torch.Tensor]:
    """One model's own state in a :meth:`NodeContext.checkpoint_state` dict: the node's model (``auxiliary``
    None) or the auxiliary model of that name (its ``aux:NAME:`` prefix taken off); the tensors, not copies."""
    if auxiliary is None:
        return {key: value for key, value in state.items() if not key.startswith(("aux:", "scalar:"))}
    prefix = f"aux:{auxiliary}:"
    return {key.removeprefix(prefix): value for key, value in state.items() if key.startswith(prefix)}


def equip(algorithm: Algorithm, ctx: NodeContext, seed: int) -> None:
    """Build the auxiliary models ``algorithm`` declares for ``ctx`` (w0 from ``seed``, on the CPU, then moved
    to the device of the node's model), as the simulator and the daemon both do before round 0."""
    device = next(ctx.model.parameters()).device
    for name, spec in algorithm.auxiliary_models(ctx.spec).items():
        ctx.auxiliary[name] = spec.build(ctx.train.input_shape, ctx.train.num_classes, seed=seed).to(device)


class AlgorithmError(ValueError):
    """A message an algorithm cannot fuse (wrong purpose, wrong segments, wrong shapes)."""


def sample_pairs(seed: int, round_: int, members: Sequence[str], pairs: int) -> tuple[Group, ...]:
    """000 Alg. 1: disjoint random sets I_A (senders) and I_B (receivers) of size Q; receiver i fuses sender i."""
    members = sorted(members)
    if len(members) < 2 * pairs:
        raise ValueError(f"round {round_} needs {2 * pairs} nodes for Q={pairs}, only {len(members)} available")
    chosen = random.Random(derive_seed(seed, round_, "plan")).sample(members, 2 * pairs)
    return tuple(Group(aggregator=r, senders=(s,)) for s, r in zip(chosen[:pairs], chosen[pairs:]))


def senders_for(fleet_size: int, share: float) -> int:
    """How many of a fleet send to a round's aggregator: ``share`` of it (003: 50 %), at least 1, at most all others."""
    return max(1, min(fleet_size - 1, round(share * fleet_size)))


def sample_gather(seed: int, round_: int, members: Sequence[str], share: float) -> Group:
    """003 Alg. 1/2: one random aggregator and a random set of senders (``share`` of the fleet) around it."""
    members = sorted(members)
    if len(members) < 2:
        raise ValueError(f"round {round_} needs 2 nodes, only {len(members)} available")
    chosen = random.Random(derive_seed(seed, round_, "plan")).sample(members, 1 + senders_for(len(members), share))
    return Group(aggregator=chosen[0], senders=tuple(sorted(chosen[1:])))


AsyncShape = Literal["select", "pull", "invite"]


class Algorithm(ABC):
    """One decentralized algorithm as a protocol of roles. Subclasses hold no per-node state.

    ``architectures`` declares which peers' models it can fuse: ``identical`` ones only
    (Def-KT, FullAvg, Combo), or ``any`` registry model for the same data (it clusters them, as
    decentralized FedAvg does, or distils across them). ``replies``: whether ``aggregate`` answers
    the senders. ``pulls``: whether its aggregator fetches the messages rather than being sent them.
    :attr:`selects` and :attr:`async_shape` declare the shape of its groups, so no driver has to probe
    for them.
    """

    name: ClassVar[str]
    architectures: ClassVar[Literal["identical", "any"]] = "identical"
    replies: ClassVar[bool] = False
    pulls: ClassVar[bool] = False
    # its own settings (dfl_node.learning.algorithm_settings)
    settings_model: ClassVar[type[AlgorithmSettings]] = NoSettings
    settings: AlgorithmSettings  # an instance of settings_model: a subclass narrows the type
    # The tasks it learns (dfl_node.learning.tasks): None, any (it trains, distils and judges through the node's
    # task); else those named, ``classes_only`` saying why (a node refuses the others at start)
    tasks: ClassVar[frozenset[str] | None] = frozenset({"classification"})
    classes_only: ClassVar[str] = "its fusion reads class labels"

    def __init__(self, config: SharedSettings, settings: AlgorithmSettings | None = None) -> None:
        self.config = config  # what every algorithm shares: seed, Q, local training, supervision …
        self.settings = settings if settings is not None else self.settings_model()  # its own, and only those

    @property
    def selects(self) -> bool:
        """Whether senders choose their receivers among candidates (001's open groups) rather than being
        given one. A property, not a class constant: defkt-select selects unless its ``selection`` is
        ``random`` (then it is 001's plain Def-KT)."""
        return False

    @property
    def async_shape(self) -> AsyncShape:
        """Async mode's group: ``select``, a volunteering sender picks its receiver among candidates
        (:attr:`selects`); ``pull``, a volunteering aggregator pulls from ``invitations`` sources
        (:attr:`pulls`); ``invite``, it invites ``invitations`` senders to push to it."""
        return "select" if self.selects else "pull" if self.pulls else "invite"

    @classmethod
    def task_refusal(cls, task: str) -> str | None:
        """Why this algorithm cannot learn ``task``, in one line; None where it can."""
        if cls.tasks is None or task in cls.tasks:
            return None
        return f"{cls.name} learns {', '.join(sorted(cls.tasks))} only ({cls.classes_only}), not {task}"

    def fuses(self, mine: str, theirs: str) -> bool:
        """Whether a node running architecture ``mine`` can take part with a peer running ``theirs``."""
        return self.architectures == "any" or mine == theirs

    # ----- models besides the node's own ---------------------------------------------------
    def auxiliary_models(self, spec: ModelSpec) -> dict[str, ModelSpec]:
        """Extra models a node running ``spec`` keeps, by name (DFML's ``peak``, FML's ``meme``): a node builds
        them with its ``w0`` seed (:func:`equip`) into ``ctx.auxiliary``."""
        return {}

    def reported_models(self, ctx: NodeContext) -> dict[str, nn.Module]:
        """The models whose accuracies a node reports, by series name: the first is *the* node's
        global/local accuracy (DFML: its peak model), any others are extra series (DFML's regular model)."""
        return {"model": ctx.model}

    # ----- planning ----------------------------------------------------------------------
    @abstractmethod
    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        """Round ``round_`` over the live members (their profiles, any order); ``state`` is the last plan's."""

    def invitations(self, candidates: int) -> int:
        """Async mode: how many of ``candidates`` live peers a volunteering node involves: asks to send to it,
        pulls from, or (a sender that selects its receiver) probes."""
        return 1

    def fusion_epochs(self) -> int:
        """Passes over the aggregator's data that a fusion makes (MKT's by default): what the simulator budgets a
        round's work by (:func:`~dfl_node.sim.experiment.round_work`)."""
        return self.config.mkt_epochs

    # ----- the roles ---------------------------------------------------------------------
    def local_step(self, ctx: NodeContext, step: Step) -> None:  # noqa: B027 - an optional hook, not abstract
        """The aggregator's own work before it fuses (e.g. local training in 003); none by default."""

    @abstractmethod
    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        """Sender (or pulled source): train as the algorithm says and return what to transmit."""

    @abstractmethod
    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        """Raise :class:`AlgorithmError` unless :meth:`aggregate` can fuse ``message`` on this node.

        A node calls it before it accepts a transfer, so a sender is told "no" rather than told
        "yes" for a model that is then dropped; ``aggregate`` implementations call it too.
        """

    @abstractmethod
    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        """Fuse all ``messages`` (sorted by sender) into ``ctx.model``; return the replies by sender id."""

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        """Sender: use the aggregator's reply, if the algorithm sends one."""
        if reply is not None:
            raise AlgorithmError(f"{self.name} expects no reply, got {reply.purpose!r}")

    # ----- helpers -----------------------------------------------------------------------
    def check_purpose(self, message: ModelMessage, expected: str) -> None:
        if message.purpose != expected:
            raise AlgorithmError(f"{self.name} cannot fuse a {message.purpose!r} message (expects {expected!r})")

    def check_whole(self, ctx: NodeContext, message: ModelMessage, purpose: str) -> None:
        """``message`` carries a whole model of ``ctx``'s architecture, under ``purpose``."""
        self.check_purpose(message, purpose)
        if message.model != str(ctx.spec) or (
            [(p.name, p.is_whole) for p in message.parts] != [(name, True) for name in ctx.model.state_dict()]
        ):
            raise AlgorithmError(f"{message.purpose} from {message.sender} does not carry a whole {ctx.spec} model")


class PairAlgorithm(Algorithm):
    """000's round shape: Q disjoint pairs, each a group of one sender and its receiver."""

    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        ids = [p.node_id for p in profiles]
        return RoundPlan(round_, sample_pairs(self.config.seed, round_, ids, self.config.pairs))
