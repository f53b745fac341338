"""Decentralized FML (004, as 003 App. A.3.4 decentralizes it): a private local model and a shared meme model.

Every node keeps its own local model — any registry architecture, never sent — and a meme model of
one architecture shared by the fleet (``meme_model``), built from the same seed everywhere (004's
"initial global model"). Each round a random aggregator and a random share of the fleet as
senders; every participant runs deep mutual learning between its local and its meme model on its
own data (004 eq. 3, α and β); the senders ship their **meme** models to the aggregator, which
averages them with its own, unweighted (004 §3.3), keeps the average and sends it back to each
sender. Reported: the local model's accuracies (the node's own model), and the meme model's beside them.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from dfl_node.algorithms.base import AlgorithmError, NodeContext
from dfl_node.algorithms.gather import GatherAlgorithm
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import Step
from dfl_node.learning.algorithm_settings import FMLSettings
from dfl_node.learning.fusion import average_states
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.mutual import deep_mutual_learning


class FML(GatherAlgorithm):
    settings_model = FMLSettings
    settings: FMLSettings
    name = "fml"
    supervision_default = "ce"  # 004's CE; 003 compares it with WSM (``supervision: wsm``)

    @property
    def meme_spec(self) -> str:
        return str(ModelSpec.parse(self.settings.meme_model))

    def auxiliary_models(self, spec: ModelSpec) -> dict[str, ModelSpec]:
        return {"meme": ModelSpec.parse(self.settings.meme_model)}

    def reported_models(self, ctx: NodeContext) -> dict[str, nn.Module]:
        return {"local": ctx.model, "meme": ctx.auxiliary["meme"]}

    def _mutual(self, ctx: NodeContext, step: Step) -> None:
        s = self.settings
        deep_mutual_learning(ctx.model, ctx.auxiliary["meme"], ctx.train, ctx.local_params(), s.fml_alpha, s.fml_beta,
                             ctx.local_generator(step.round), self.supervise(ctx), self.distance(ctx), ctx.privacy)

    def _meme_message(self, ctx: NodeContext, round_: int, purpose: str, parts: tuple) -> ModelMessage:
        return ModelMessage(sender=ctx.node_id, round=round_, purpose=purpose, num_samples=ctx.num_samples,
                            parts=parts, model=self.meme_spec)

    def local_step(self, ctx: NodeContext, step: Step) -> None:
        self._mutual(ctx, step)

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        self._mutual(ctx, step)
        return self._meme_message(ctx, step.round, "fml.meme", parts_from_state(ctx.auxiliary["meme"].state_dict()))

    def _check(self, ctx: NodeContext, message: ModelMessage, purpose: str) -> None:
        self.check_model(ctx, message, purpose)
        if message.model != self.meme_spec:
            raise AlgorithmError(f"fml: {message.purpose} from {message.sender} is a {message.model}, "
                                 f"not the fleet's meme model {self.meme_spec}")

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self._check(ctx, message, "fml.meme")

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:
            self.check_message(ctx, message)
        meme = ctx.auxiliary["meme"]
        memes = {m.sender: state_from_parts(m.parts) for m in messages}
        memes[ctx.node_id] = meme.state_dict()
        order = sorted(memes)  # summation order of every driver
        average = average_states([memes[n] for n in order], [1.0] * len(order))  # 004: unweighted
        meme.load_state_dict(average)
        parts = parts_from_state(meme.state_dict())
        return {m.sender: self._meme_message(ctx, step.round, "fml.average", parts) for m in messages}

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        if reply is None:
            raise AlgorithmError("an FML sender needs the averaged meme model back")
        self._check(ctx, reply, "fml.average")
        ctx.auxiliary["meme"].load_state_dict(state_from_parts(reply.parts))
