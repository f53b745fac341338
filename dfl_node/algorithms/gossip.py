"""Pull gossip: the smallest complete algorithm, and README's example of writing one.

Each round, Q random nodes train on their own data, each *pulls* the current model of another
random node (the pull exchange, :mod:`dfl_node.algorithms.pull`), and averages it into its own with
sample-count weights (000 eq. 9, as FullAvg fuses).
"""

from __future__ import annotations

from collections.abc import Sequence

from dfl_node.algorithms.base import NodeContext
from dfl_node.algorithms.fullavg import average_by_samples
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step
from dfl_node.algorithms.pull import PullPairs


class Gossip(PullPairs):
    name = "gossip"
    tasks = None  # averaging knows no task

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        return average_by_samples(self, ctx, messages)
