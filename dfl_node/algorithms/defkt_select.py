"""001's Def-KT: the sender keeps its trained model (Procedure 1), and picks its receiver (Procedure 2).

A round draws Q random senders (I_A, as 000 does). With ``selection: random`` the receivers are drawn
at random too (Procedure 1, exactly Def-KT's plan). Otherwise every sender's group is **open**: the
non-senders are shuffled (seed-derived) and dealt out into Q disjoint pools of candidates (at most
``selection_candidates`` each), and the sender, once trained, probes its pool and chooses the
receiver (:mod:`dfl_node.algorithms.selection` has the rules). The pools are disjoint so that no two
senders can choose the same node: the choice depends only on the sender's model and its candidates'
models, never on which sender asked first, and the fleet and the simulator choose alike. The
receiver then runs Def-KT's mutual knowledge transfer and keeps the received model.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F

from dfl_node.algorithms.base import NodeContext, derive_seed, sample_pairs
from dfl_node.algorithms.defkt import DefKT
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.algorithms.plan import Group, NodeProfile, RoundPlan, Step
from dfl_node.algorithms.selection import (
    Probe,
    ProbeAnswer,
    SelectsReceiver,
    check_probe,
    class_accuracy,
    error_weights,
    least_certain,
    per_class,
    probe_budget,
    rank_by_profile,
    rank_by_samples,
)
from dfl_node.learning.algorithm_settings import SelectionSettings, SharedSettings

log = logging.getLogger(__name__)


def candidate_pools(seed: int, round_: int, others: Sequence[str], pools: int, limit: int) -> list[tuple[str, ...]]:
    """``others`` shuffled from (seed, round) and dealt into ``pools`` disjoint pools of at most ``limit``
    (0: no limit)."""
    order = sorted(others)
    random.Random(derive_seed(seed, round_, "candidates")).shuffle(order)
    dealt = [order[i::pools] for i in range(pools)]
    return [tuple(sorted(pool[:limit] if limit else pool)) for pool in dealt]


class DefKTSelect(SelectsReceiver, DefKT):
    tasks = frozenset({"classification"})
    classes_only = "a sender chooses its receiver by their class scores on probes (001)"
    settings_model = SelectionSettings
    settings: SelectionSettings
    name = "defkt-select"
    sender_keeps_trained_default: ClassVar[bool] = True  # 001 Procedure 1: "stores w̃ as its local model"

    def __init__(self, config: SharedSettings, settings: SelectionSettings | None = None) -> None:
        super().__init__(config, settings)
        if self.settings.selection == "probe-samples":
            log.warning("defkt-select with probe-samples selection: every round a sender sends up to %d of its raw "
                        "validation samples, with their labels, to each of its candidates",
                        min(self.settings.selection_samples, 256))

    @property
    def selection_mode(self) -> str:
        return self.settings.selection

    @property
    def selects(self) -> bool:
        """Whether senders choose their receivers (open groups) rather than being given one."""
        return self.settings.selection != "random"

    def invitations(self, candidates: int) -> int:
        """Async mode: a selecting sender probes ``selection_candidates`` of them (0: all)."""
        return (self.settings.selection_candidates or candidates) if self.selects else super().invitations(candidates)

    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        ids = [p.node_id for p in profiles]
        pairs = sample_pairs(self.config.seed, round_, ids, self.config.pairs)  # I_A (and Procedure 1's I_B)
        if not self.selects:
            return RoundPlan(round_, pairs)
        senders = [g.senders[0] for g in pairs]
        others = [i for i in ids if i not in senders]
        pools = candidate_pools(self.config.seed, round_, others, len(senders), self.settings.selection_candidates)
        return RoundPlan(round_, tuple(Group("", (s,), candidates=pool) for s, pool in zip(senders, pools)))

    def _trained(self, ctx: NodeContext, message: ModelMessage) -> torch.nn.Module:
        model = copy.deepcopy(ctx.model)
        model.load_state_dict(state_from_parts(message.parts))
        return model

    def probe(self, ctx: NodeContext, step: Step, message: ModelMessage) -> Probe:
        model = self._trained(ctx, message)
        if self.selection_mode == "class-profile":
            errors, held = per_class(model, ctx.val, ctx.val.num_classes)
            return Probe(ctx.node_id, step.round, "class-profile", weights=error_weights(errors, held))
        idx = least_certain(model, ctx.val, probe_budget(self.settings.selection_samples, ctx.val.input_shape))
        return Probe(ctx.node_id, step.round, "probe-samples", x=ctx.val.x[idx].contiguous(), y=ctx.val.y[idx].clone())

    def answer(self, ctx: NodeContext, probe: Probe) -> ProbeAnswer:
        check_probe(probe, ctx.train.input_shape, ctx.train.num_classes, self.selection_mode)
        if probe.mode == "class-profile":
            return ProbeAnswer(ctx.node_id, class_accuracy=class_accuracy(ctx.model, ctx.val, ctx.train.num_classes))
        assert probe.x is not None and probe.y is not None
        x, y = probe.x.to(ctx.train.x.device), probe.y.to(ctx.train.y.device)
        with torch.no_grad():
            ctx.model.eval()
            logits = ctx.model(x)
            correct = int((logits.argmax(1) == y).sum())
            loss = float(F.cross_entropy(logits, y))
        return ProbeAnswer(ctx.node_id, samples=probe.samples, correct=correct, loss=loss)

    def rank(self, ctx: NodeContext, step: Step, probe: Probe, answers: Mapping[str, ProbeAnswer]) -> list[str]:
        if probe.mode == "class-profile":
            return rank_by_profile(probe.weights, answers)
        return rank_by_samples(answers)
