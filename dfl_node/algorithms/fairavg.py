"""Fairness-aware adaptive aggregation (002, Alg. 1, eqs. 4–5).

Each round, Q random nodes each find a learning pair (another random node): the node trains
locally (Alg. 1 line 3), **pulls** its pair's current model (line 5), evaluates both models on its
own data (line 6: ``pef`` = accuracy, 002's choice), and averages them with the weights of eqs. 4–5
(lines 7–8): P_i for its own model, P_j = 1 − P_i for the pulled one. A node whose own model does
better on its own data keeps more of it, so a few nodes with large or skewed datasets cannot impose
their model on the rest (002's "small-group domination"). The pair is only asked for its model
(a pull group: sources are not told about the round; lines 3–5 are the pull exchange it shares with
pull gossip, :mod:`dfl_node.algorithms.pull`). C, the clipping of P_i and the data pef is
measured on are settings; the readings are in :mod:`dfl_node.learning.fairness`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

from dfl_node.algorithms.base import NodeContext
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.algorithms.plan import Step
from dfl_node.algorithms.pull import PullPairs
from dfl_node.learning.algorithm_settings import FairAvgSettings
from dfl_node.learning.fairness import fairness_weight
from dfl_node.learning.fusion import weighted_average_

log = logging.getLogger(__name__)


class FairAvg(PullPairs):
    tasks = None  # 002's pef: the task's performance in [0, 1] (dfl_node.learning.tasks.Task.performance)
    settings_model = FairAvgSettings
    settings: FairAvgSettings
    name = "fairavg"

    def weight(self, ctx: NodeContext, pulled: ModelMessage) -> float:
        """P_i (eq. 4) of this node's model against ``pulled``, both scored on this node's own data."""
        data = ctx.val if self.settings.fair_data == "val" else ctx.train
        other = copy.deepcopy(ctx.model)
        other.load_state_dict(state_from_parts(pulled.parts))
        s = self.settings
        task = ctx.task
        return fairness_weight(task.performance(ctx.model, data), task.performance(other, data), s.fair_c,
                               s.fair_weight_min, s.fair_weight_max)

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:  # one pair in 002; several are fused one after another, in source order
            self.check_message(ctx, message)
            own = self.weight(ctx, message)
            log.debug("%s: round %d: P_i = %.4f against %s", ctx.node_id, step.round, own, message.sender)
            weighted_average_(ctx.model.state_dict(), state_from_parts(message.parts), own, 1.0 - own)
        return {}
