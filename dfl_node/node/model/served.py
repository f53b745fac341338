"""The model a node puts to use (``GET /model``, ``POST /predict``, ``dfl-node export``): which of its models, how
a checkpoint describes it, and the copy a serving node keeps of the committed one.

*Which*: the model whose accuracy the node reports as its own (:meth:`Algorithm.reported_models`' first: the
node's model, DFML's peak model). *Committed*: the model a checkpoint holds, never one that a role is training or
fusing in a worker thread right now. The first request reads it from the node's newest checkpoint while no
checkpoint is being written (:meth:`dfl_node.node.node.Node.committed_model`); from then on the node keeps a
copy, replaced after every checkpoint (:meth:`ServedModel.commit`, in the thread that wrote the checkpoint, while
the role that changed the model still holds it): a request reads that copy whatever the node is doing, and never
waits for a role. A node nobody asks keeps nothing (an aggregator's memory, the simulator's hundreds of nodes).
``dfl-node export`` reads the same model from a state folder (:func:`dfl_node.node.model.persistence.read_trained`): its
checkpoint's metadata says which entries form it and how to rebuild it (:meth:`ServedModel.metadata`).

*What it means*: the node's task (:mod:`dfl_node.learning.tasks`) is in the checkpoint's metadata and every card,
and so, for an anomaly model, is its threshold (:meth:`~dfl_node.learning.tasks.Anomaly.threshold` on the node's
validation set), computed once per checkpoint, when the model it judges is committed, never per request: the
``/predict`` of a model and the export of its checkpoint flag a sample alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from dfl_node.algorithms import Algorithm, NodeContext
from dfl_node.algorithms.base import model_entries
from dfl_node.errors import OperatorError
from dfl_node.learning.export import ANOMALY, CLASSIFICATION, ModelCard, TrainedModel, build_model, in_layout_order
from dfl_node.learning.models import ModelSpec, fingerprint, param_digest
from dfl_node.learning.tasks import Anomaly

# A checkpoint's metadata entries that describe its served model (besides the node's "fingerprint"). Its "task" and
# "threshold" (anomaly) are not among them: a checkpoint written before tasks is a classifier's, and says so by
# having none.
SERVED_KEYS = ("served_spec", "served_aux", "sample_shape", "num_classes", "node")


@dataclass(frozen=True)
class Served:
    """Which model of a checkpoint is served, and what rebuilding it takes."""

    spec: str
    auxiliary: str | None  # None: the node's model; else the name of the algorithm's model (``peak``)
    sample_shape: tuple[int, ...]
    num_classes: int  # its output width (classes, targets, an autoencoder's sample values)
    node: str
    task: str = CLASSIFICATION
    threshold: float | None = None  # anomaly: that of the newest checkpoint (None: not computed yet, another task)

    def metadata(self) -> dict[str, str]:
        """Checkpoint metadata entries (:data:`SERVED_KEYS`, the task, and a threshold where there is one)."""
        return {"served_spec": self.spec, "served_aux": self.auxiliary or "",
                "sample_shape": json.dumps(list(self.sample_shape)), "num_classes": str(self.num_classes),
                "node": self.node, "task": self.task,
                **({} if self.threshold is None else {"threshold": str(self.threshold)})}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], where: str) -> Served:
        """What :meth:`metadata` wrote; a checkpoint from before checkpoints described their model is an
        :class:`OperatorError` saying how to get one that does."""
        missing = [key for key in SERVED_KEYS if key not in metadata]
        if missing:
            raise OperatorError(f"{where} does not say how to rebuild its model (no {', '.join(missing)} in its "
                                "metadata: written by an older dfl-node); start and stop its node once with this "
                                "version, which rewrites the checkpoint")
        try:
            shape = tuple(int(d) for d in json.loads(metadata["sample_shape"]))
            threshold = float(metadata["threshold"]) if "threshold" in metadata else None
            served = cls(metadata["served_spec"], metadata["served_aux"] or None, shape, int(metadata["num_classes"]),
                         metadata["node"], metadata.get("task", CLASSIFICATION), threshold)
        except (ValueError, TypeError) as exc:
            raise OperatorError(f"{where}: malformed model description in its metadata ({exc})") from None
        if served.task == ANOMALY and (threshold is None or math.isnan(threshold)):
            raise OperatorError(f"{where}: malformed model description in its metadata (an anomaly model with no "
                                "threshold)")
        return served

    def trained(self, checkpoint_state: Mapping[str, torch.Tensor], round_: int, *, copy: bool) -> TrainedModel:
        """The served model of a :meth:`NodeContext.checkpoint_state` dict (CPU tensors), with its card; ``copy``
        where those tensors are the live model's, which the next role changes in place."""
        state = in_layout_order(self.spec, self.sample_shape, self.num_classes,
                                model_entries(checkpoint_state, self.auxiliary))
        if copy:
            state = {name: tensor.detach().clone() for name, tensor in state.items()}
        card = ModelCard(self.spec, self.sample_shape, self.num_classes,
                         fingerprint(ModelSpec.parse(self.spec).name, state), self.node, round_, param_digest(state),
                         self.task, self.threshold)
        return TrainedModel(card, state)


def served_of(algorithm: Algorithm, ctx: NodeContext) -> Served:
    """The model ``ctx``'s node reports as its own: the first of ``algorithm.reported_models`` (an auxiliary model,
    such as DFML's peak, is found by identity; anything else is the node's model)."""
    reported = next(iter(algorithm.reported_models(ctx).values()))
    auxiliary = next((name for name, model in ctx.auxiliary.items() if model is reported), None)
    spec = ctx.spec if auxiliary is None else algorithm.auxiliary_models(ctx.spec)[auxiliary]
    return Served(str(spec), auxiliary, ctx.train.input_shape, ctx.train.num_classes, ctx.node_id, ctx.task.name)


class ServedModel:
    """A node's served model: :class:`Served`, and the committed copy, kept once a request asked for it."""

    def __init__(self, algorithm: Algorithm, ctx: NodeContext) -> None:
        self.algorithm, self.ctx = algorithm, ctx
        self.served = served_of(algorithm, ctx)
        self.committed: TrainedModel | None = None  # none until asked for: most nodes never are

    def metadata(self) -> dict[str, str]:
        """The entries of the checkpoint about to be written, in the thread that writes it. An anomaly model's
        threshold is computed here, from a CPU copy of the served model as it is now: the one written, which the
        role that saves holds (a save outside any role writes a snapshot taken just before, once no role runs);
        it goes into the card of every copy of that model (:meth:`commit`, :meth:`keep`, ``dfl-node export``)."""
        if self.served.task == ANOMALY:
            reported = next(iter(self.algorithm.reported_models(self.ctx).values()))
            state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in reported.state_dict().items()}
            served = self.served  # a copy of the model, in eval mode: the live one stays in the mode its role set
            self.served = replace(served, threshold=self._threshold(
                build_model(served.spec, served.sample_shape, served.num_classes, state)))
        return self.served.metadata()

    def _threshold(self, model: nn.Module) -> float:
        """``model``'s anomaly threshold on the node's validation set, on the CPU as ``/predict`` scores."""
        task = self.ctx.task
        assert isinstance(task, Anomaly)  # the served task is the node's
        return task.threshold(model, self.ctx.val.to("cpu"))

    def keep(self, committed: TrainedModel) -> None:
        """The committed model, read from the checkpoint at the first request: kept from now on. A node that
        resumed an anomaly model and has not checkpointed since computes its threshold now."""
        if committed.card.task == ANOMALY and committed.card.threshold is None:
            threshold = self._threshold(committed.module)
            self.served = replace(self.served, threshold=threshold)
            committed = TrainedModel(replace(committed.card, threshold=threshold), committed.state)
        self.committed = committed

    def commit(self, checkpoint_state: Mapping[str, torch.Tensor], round_: int, *, shared: bool) -> None:
        """A checkpoint of ``checkpoint_state`` (CPU tensors; ``shared``: the live model's own) was written at
        ``round_``: that is now the committed model, where one is kept. The reference is replaced in one
        assignment, so a request reads the old model or the new one, whole."""
        if self.committed is not None:
            self.committed = self.served.trained(checkpoint_state, round_, copy=shared)
