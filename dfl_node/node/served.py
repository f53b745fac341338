"""The model a node puts to use (``GET /model``, ``POST /predict``, ``dfl-node export``): which of its models, how
a checkpoint describes it, and the copy a serving node keeps of the committed one.

*Which*: the model whose accuracy the node reports as its own (:meth:`Algorithm.reported_models`' first: the
node's model, DFML's peak model). *Committed*: the model a checkpoint holds, never one that a role is training or
fusing in a worker thread right now. The first request reads it from the node's newest checkpoint while no
checkpoint is being written (:meth:`dfl_node.node.daemon.Node.committed_model`); from then on the node keeps a
copy, replaced after every checkpoint (:meth:`ServedModel.commit`, in the thread that wrote the checkpoint, while
the role that changed the model still holds it): a request reads that copy whatever the node is doing, and never
waits for a role. A node nobody asks keeps nothing (an aggregator's memory, the simulator's hundreds of nodes).
``dfl-node export`` reads the same model from a state folder (:func:`dfl_node.node.persistence.read_trained`): its
checkpoint's metadata says which entries form it and how to rebuild it (:meth:`ServedModel.metadata`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dfl_node.algorithms import Algorithm, NodeContext
from dfl_node.algorithms.base import model_entries
from dfl_node.errors import OperatorError
from dfl_node.learning.export import ModelCard, TrainedModel, in_layout_order
from dfl_node.learning.models import ModelSpec, fingerprint, param_digest

# A checkpoint's metadata entries that describe its served model (besides the node's "fingerprint").
SERVED_KEYS = ("served_spec", "served_aux", "sample_shape", "num_classes", "node")


@dataclass(frozen=True)
class Served:
    """Which model of a checkpoint is served, and what rebuilding it takes."""

    spec: str
    auxiliary: str | None  # None: the node's model; else the name of the algorithm's model (``peak``)
    sample_shape: tuple[int, ...]
    num_classes: int
    node: str

    def metadata(self) -> dict[str, str]:
        """Checkpoint metadata entries (:data:`SERVED_KEYS`)."""
        return {"served_spec": self.spec, "served_aux": self.auxiliary or "",
                "sample_shape": json.dumps(list(self.sample_shape)), "num_classes": str(self.num_classes),
                "node": self.node}

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
            return cls(metadata["served_spec"], metadata["served_aux"] or None, shape, int(metadata["num_classes"]),
                       metadata["node"])
        except (ValueError, TypeError) as exc:
            raise OperatorError(f"{where}: malformed model description in its metadata ({exc})") from None

    def trained(self, checkpoint_state: Mapping[str, torch.Tensor], round_: int, *, copy: bool) -> TrainedModel:
        """The served model of a :meth:`NodeContext.checkpoint_state` dict (CPU tensors), with its card; ``copy``
        where those tensors are the live model's, which the next role changes in place."""
        state = in_layout_order(self.spec, self.sample_shape, self.num_classes,
                                model_entries(checkpoint_state, self.auxiliary))
        if copy:
            state = {name: tensor.detach().clone() for name, tensor in state.items()}
        card = ModelCard(self.spec, self.sample_shape, self.num_classes,
                         fingerprint(ModelSpec.parse(self.spec).name, state), self.node, round_, param_digest(state))
        return TrainedModel(card, state)


def served_of(algorithm: Algorithm, ctx: NodeContext) -> Served:
    """The model ``ctx``'s node reports as its own: the first of ``algorithm.reported_models`` (an auxiliary model,
    such as DFML's peak, is found by identity; anything else is the node's model)."""
    reported = next(iter(algorithm.reported_models(ctx).values()))
    auxiliary = next((name for name, model in ctx.auxiliary.items() if model is reported), None)
    spec = ctx.spec if auxiliary is None else algorithm.auxiliary_models(ctx.spec)[auxiliary]
    return Served(str(spec), auxiliary, ctx.train.input_shape, ctx.train.num_classes, ctx.node_id)


class ServedModel:
    """A node's served model: :class:`Served`, and the committed copy, kept once a request asked for it."""

    def __init__(self, algorithm: Algorithm, ctx: NodeContext) -> None:
        self.served = served_of(algorithm, ctx)
        self.committed: TrainedModel | None = None  # none until asked for: most nodes never are

    def metadata(self) -> dict[str, str]:
        return self.served.metadata()

    def keep(self, committed: TrainedModel) -> None:
        """The committed model, read from the checkpoint at the first request: kept from now on."""
        self.committed = committed

    def commit(self, checkpoint_state: Mapping[str, torch.Tensor], round_: int, *, shared: bool) -> None:
        """A checkpoint of ``checkpoint_state`` (CPU tensors; ``shared``: the live model's own) was written at
        ``round_``: that is now the committed model, where one is kept. The reference is replaced in one
        assignment, so a request reads the old model or the new one, whole."""
        if self.committed is not None:
            self.committed = self.served.trained(checkpoint_state, round_, copy=shared)
