"""What 003's group algorithms share (DFML, partial training, decentralized FML): the round shape and
models of other architectures.

Each round one random aggregator and a random share of the fleet as senders (``senders``: 50 % in
003, :func:`~dfl_node.algorithms.base.sample_gather`); every participant trains locally, the senders
ship a model to the aggregator, which answers each of them. A received model is built from this
node's own registry by the spec its message names, for this node's data, and its tensors loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from torch import nn

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext, sample_gather, senders_for
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import NodeProfile, RoundPlan, Step
from dfl_node.learning.algorithm_settings import GroupSettings
from dfl_node.learning.models import ModelSpec, tensor_shapes
from dfl_node.learning.mutual import Distance, Supervision, class_proportions, supervision
from dfl_node.learning.tasks import Classification
from dfl_node.learning.training import local_sgd


class GatherAlgorithm(Algorithm):
    tasks = None  # mutual learning distils with the task's distance, WSM (classes only) gives way to its loss
    settings_model = GroupSettings
    settings: GroupSettings
    architectures = "any"
    replies = True
    supervision_default: ClassVar[str] = "wsm"  # 003 runs everything with WSM (its §4.2)

    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        self.check_fleet(profiles)
        group = sample_gather(self.config.seed, round_, [p.node_id for p in profiles], self.settings.senders)
        return RoundPlan(round_, (group,), self.next_state(round_, len(profiles), state))

    def check_fleet(self, profiles: Sequence[NodeProfile]) -> None:
        """Raise :class:`AlgorithmError` for a fleet this algorithm cannot fuse (a holder plans first)."""
        mine = profiles[0].model if profiles else ""
        for profile in profiles:
            if not self.fuses(mine, profile.model):
                raise AlgorithmError(f"{self.name} cannot fuse {profile.model} with {mine}")

    def next_state(self, round_: int, members: int, state: Mapping[str, str]) -> dict[str, str]:
        """The algorithm state round ``round_`` needs and hands on (none by default)."""
        return {}

    def invitations(self, candidates: int) -> int:
        return senders_for(candidates + 1, self.settings.senders)

    def supervise(self, ctx: NodeContext) -> Supervision:
        """The supervision term on the node's data: WSM with its class proportions (eq. 2), or CE
        (``supervision``); a task without classes supervises with its own loss."""
        if not ctx.task.classes:
            return ctx.task.loss
        kind = self.config.supervision or self.supervision_default
        return supervision(kind, class_proportions(ctx.train.y, ctx.train.num_classes) if kind == "wsm" else None)

    @staticmethod
    def distance(ctx: NodeContext) -> Distance | None:
        """What mutual learning distils with: the node's task's distance (None: classification's KL, computed once
        per batch for every pair in :mod:`dfl_node.learning.mutual`)."""
        return None if isinstance(ctx.task, Classification) else ctx.task.distance

    def train_locally(self, ctx: NodeContext, step: Step) -> None:
        """A participant's local pass, supervised as :meth:`supervise` says."""
        local_sgd(ctx.model, ctx.train, ctx.local_params(), ctx.local_generator(step.round),
                  loss_fn=self.supervise(ctx), privacy=ctx.privacy)

    def local_step(self, ctx: NodeContext, step: Step) -> None:
        self.train_locally(ctx, step)

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        """Every participant trains; a sender then ships its whole model (FML overrides: its meme model)."""
        self.train_locally(ctx, step)
        return ctx.message(step.round, f"{self.name}.model", parts_from_state(ctx.model.state_dict()))

    @staticmethod
    def layout(ctx: NodeContext, model: str) -> dict[str, tuple[int, ...]]:
        """Tensor shapes of registry model ``model`` for this node's data (:func:`tensor_shapes`)."""
        try:
            return dict(tensor_shapes(model, tuple(ctx.train.input_shape), ctx.train.num_classes))
        except ValueError as exc:
            raise AlgorithmError(str(exc)) from None

    def check_model(self, ctx: NodeContext, message: ModelMessage, purpose: str) -> None:
        """``message`` is ``purpose`` and carries a whole model of the architecture it names, for our data."""
        self.check_purpose(message, purpose)
        if not self.fuses(str(ctx.spec), message.model):
            raise AlgorithmError(f"{self.name} cannot fuse {message.model} from {message.sender} with {ctx.spec}")
        try:
            layout = self.layout(ctx, message.model)
        except AlgorithmError as exc:
            raise AlgorithmError(f"{message.purpose} from {message.sender}: {exc}") from None
        carried = [(p.name, p.shape, p.is_whole) for p in message.parts]
        if carried != [(name, shape, True) for name, shape in layout.items()]:
            raise AlgorithmError(f"{message.purpose} from {message.sender} is not a whole {message.model} model")

    @staticmethod
    def build(ctx: NodeContext, message: ModelMessage) -> nn.Module:
        """The model ``message`` carries, built from our registry on the node's device (checked already)."""
        device = next(ctx.model.parameters()).device
        model = ModelSpec.parse(message.model).build(ctx.train.input_shape, ctx.train.num_classes).to(device)
        model.load_state_dict(state_from_parts(message.parts))
        return model
