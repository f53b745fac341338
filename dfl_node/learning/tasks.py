"""What a fleet learns: a **task** says what a model's outputs mean, how they are trained, distilled and judged.

Every algorithm trains, fuses and evaluates through its node's task, so that the same Def-KT, FullAvg or Combo
learns a class, a reading to forecast or what is normal for a sensor:

* **classification** (000–004's own, and the default): a score per class; cross-entropy, KL between the two
  models' class probabilities (000 eqs. 5–6), accuracy. Its arithmetic is the one every earlier run used.
* **regression**: one or more float targets (a forecast of the next steps, a remaining life); MSE (or Huber)
  training, and for mutual knowledge transfer the distance between the two models' outputs in place of KL (the
  reading of KD for regression in the issue's anchors: the teacher's output as a soft target); RMSE (headline),
  MAE and R².
* **anomaly**: an autoencoder trained to reconstruct normal samples; a sample's anomaly score is its
  reconstruction error, flagged above a quantile of the node's validation errors (the PyOD baseline). Training
  is regression onto the sample itself (:meth:`Task.supervised`), so every algorithm that fuses regressors fuses
  autoencoders; judged by the ROC AUC of the scores against the flags of a labelled set (1: anomalous).

A task is chosen by the ``task`` setting (``--task``) and is pluggable: the entry-point group ``dfl_node.tasks``
names classes of :class:`Task` (``dfl-node plugins`` lists them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.errors import OperatorError
from dfl_node.learning import work
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import mkt_losses
from dfl_node.learning.local_data import Reads
from dfl_node.learning.training import Evaluation, LossFn, evaluate
from dfl_node.plugins import PluginError, load_installed

EVAL_BATCH = 2048


class Task(ABC):
    """One kind of learning problem. ``metric`` names the headline figure every table, status and result shows
    (``higher_is_better`` says which way is good); ``classes`` whether samples carry class labels, which
    class-based algorithms (a class profile's selection, 003's WSM, probes of class scores) need."""

    name: ClassVar[str]
    metric: ClassVar[str]
    higher_is_better: ClassVar[bool]
    classes: ClassVar[bool] = False
    reads: ClassVar[Reads] = "targets"  # what a data file's y is: class labels, float targets, or anomaly flags

    @abstractmethod
    def outputs(self, data: ArrayDataset) -> int:
        """The width of a model's output for ``data``: what a model factory is asked for (its ``num_classes``)."""

    def supervised(self, data: ArrayDataset) -> ArrayDataset:
        """``data`` as training reads it, ``(sample, target)`` (the data itself but for an autoencoder's)."""
        return data

    @property
    @abstractmethod
    def loss(self) -> LossFn:
        """The supervised loss, batch mean, of ``(outputs, targets)``."""

    def mutual_losses(self, out_received: torch.Tensor, out_local: torch.Tensor,
                      targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """000 eqs. 5–6 for this task: each model's supervised loss plus its :meth:`distance` from the other's
        output, halved: with a distance unbounded as KL is not, 000's plain sum steps twice as far as a local
        update (and diverged where local training did not), halved a fusion's step is a local one's."""
        loss = self.loss
        return (0.5 * (loss(out_received, targets) + self.distance(out_received, out_local)),
                0.5 * (loss(out_local, targets) + self.distance(out_local, out_received)))

    def distance(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """How far ``student``'s outputs are from ``teacher``'s (detached: a constant target), batch mean: what
        mutual learning distils with (003's weighted KL, 004's KL, for this task)."""
        return self.loss(student, teacher.detach())

    def sample_losses(self, model: nn.Module, data: ArrayDataset) -> torch.Tensor:
        """Each sample's own supervised loss under ``model`` (float64, (N,)), over the samples training reads
        (:meth:`supervised`: an autoencoder's normal ones, each its own target): :attr:`loss` of a batch of that one
        sample — classification's cross-entropy, regression's squared error (or Huber) averaged over the targets, an
        autoencoder's reconstruction error — batched by ``torch.func.vmap``. A model fits the samples it trained on
        better than others: what a membership-inference attack scores (:mod:`.membership_inference`). A task whose
        loss ``vmap`` cannot batch overrides it."""
        from torch.func import vmap  # noqa: PLC0415 - functorch only where an attack runs

        supervised = self.supervised(data)
        outputs = _outputs(model, supervised)
        targets = supervised.y.to(outputs.device)
        if targets.is_floating_point():  # as evaluation reads float targets: one row per sample, in float64
            targets = targets.to(torch.float64).reshape(outputs.shape)
        loss = self.loss
        return vmap(lambda output, target: loss(output[None], target[None]))(outputs, targets)

    @abstractmethod
    def evaluate(self, model: nn.Module, data: ArrayDataset) -> Evaluation:
        """``model`` judged on ``data`` (in float32): the headline metric, the mean loss and the other metrics."""

    def performance(self, model: nn.Module, data: ArrayDataset) -> float:
        """``model``'s performance on ``data`` in [0, 1], higher better (002's pef, which its weights need): a
        loss ℓ as ``1 / (1 + ℓ)``; classification's accuracy."""
        return 1.0 / (1.0 + self.evaluate(model, data).loss)

    def better(self, a: float, b: float) -> bool:
        """Whether metric value ``a`` is better than ``b``."""
        return a > b if self.higher_is_better else a < b


class Classification(Task):
    name, metric, higher_is_better, classes, reads = "classification", "accuracy", True, True, "classes"

    def outputs(self, data: ArrayDataset) -> int:
        return data.num_classes

    @property
    def loss(self) -> LossFn:
        return F.cross_entropy

    def mutual_losses(self, out_received: torch.Tensor, out_local: torch.Tensor,
                      targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mkt_losses(out_received, out_local, targets)

    def distance(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        return F.kl_div(F.log_softmax(student, dim=1), F.log_softmax(teacher, dim=1).detach(), reduction="batchmean",
                        log_target=True)

    def evaluate(self, model: nn.Module, data: ArrayDataset) -> Evaluation:
        return evaluate(model, data, EVAL_BATCH)

    def performance(self, model: nn.Module, data: ArrayDataset) -> float:
        return self.evaluate(model, data).score  # 002's own pef: accuracy


@dataclass(frozen=True)
class Regression(Task):
    """Float targets ``y`` (N, T); ``huber``: the Huber loss (δ = 1) in place of MSE, for targets with outliers."""

    huber: bool = False
    name, metric, higher_is_better = "regression", "rmse", False

    def outputs(self, data: ArrayDataset) -> int:
        return data.num_classes  # a regression dataset's "classes" are its targets

    @property
    def loss(self) -> LossFn:
        return F.huber_loss if self.huber else F.mse_loss

    def evaluate(self, model: nn.Module, data: ArrayDataset) -> Evaluation:
        outputs = _outputs(model, data)
        y = data.y.to(outputs.device, torch.float64).reshape(outputs.shape)
        errors = outputs - y
        values, squared = max(errors.numel(), 1), float(errors.square().sum())
        mse, mae = squared / values, float(errors.abs().sum()) / values
        spread = float((y - y.mean(0)).square().sum()) if len(y) else 0.0
        r2 = 1.0 - squared / spread if spread > 0 else 0.0
        loss = float(self.loss(outputs, y)) if len(y) else 0.0
        return Evaluation(mse ** 0.5, loss, len(data), {"rmse": mse ** 0.5, "mae": mae, "r2": r2})


@dataclass(frozen=True)
class Anomaly(Task):
    """An autoencoder: its output is its input, flattened, reconstructed; ``quantile`` of the node's validation
    errors is its flagging threshold. A labelled set's ``y`` flags anomalous samples (1) among normal ones (0)."""

    quantile: float = 0.99
    name, metric, higher_is_better, reads = "anomaly", "auc", True, "flags"

    def outputs(self, data: ArrayDataset) -> int:
        return int(torch.Size(data.input_shape).numel())

    def supervised(self, data: ArrayDataset) -> ArrayDataset:
        """The samples flagged normal (all where none is flagged), each its own target, flattened."""
        normal = _normal(data)
        return ArrayDataset(normal.x, normal.x.flatten(1), self.outputs(data))

    @property
    def loss(self) -> LossFn:
        return F.mse_loss

    def scores(self, model: nn.Module, data: ArrayDataset) -> torch.Tensor:
        """Each sample's anomaly score: its mean squared reconstruction error (float64)."""
        return reconstruction_error(_outputs(model, data), data.x)

    def threshold(self, model: nn.Module, val: ArrayDataset) -> float:
        """The score above which a sample is flagged: ``quantile`` of the scores of the validation set's normal
        samples (an incident it recorded, flagged, would raise the bar it is to be caught by)."""
        scores = self.scores(model, _normal(val))
        return float(torch.quantile(scores, self.quantile)) if len(scores) else float("inf")

    def evaluate(self, model: nn.Module, data: ArrayDataset) -> Evaluation:
        scores = self.scores(model, data).cpu()
        flags = data.y.cpu() if data.y.dtype == torch.int64 else torch.zeros(len(data), dtype=torch.int64)
        auc = roc_auc(scores, flags)
        error = float(scores.mean()) if len(scores) else 0.0
        return Evaluation(auc, error, len(data), {"auc": auc, "reconstruction_error": error})


def reconstruction_error(reconstructed: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """Each sample's mean squared reconstruction error, float64 (N,): an autoencoder's anomaly score, as a node
    scores its data and as its export computes it (:class:`~dfl_node.learning.export.ReconstructionError`)."""
    return (reconstructed.flatten(1).double() - samples.flatten(1).double()).square().mean(1)


def roc_auc(scores: torch.Tensor, flags: torch.Tensor) -> float:
    """The ROC AUC of ``scores`` for ``flags`` (1 positive): the chance a positive outscores a negative, ties
    half (Mann–Whitney U over average ranks); 0.5 where the flags hold one class only (nothing to rank)."""
    positives = int(flags.sum())
    negatives = len(flags) - positives
    if not positives or not negatives:
        return 0.5
    order = torch.argsort(scores.double(), stable=True)
    ranked = scores.double()[order]
    ranks = torch.empty(len(scores), dtype=torch.float64)
    start = 0
    while start < len(ranked):  # average ranks over ties
        stop = start + 1
        while stop < len(ranked) and ranked[stop] == ranked[start]:
            stop += 1
        ranks[order[start:stop]] = (start + stop + 1) / 2
        start = stop
    rank_sum = float(ranks[flags.bool()].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def _normal(data: ArrayDataset) -> ArrayDataset:
    """The samples of ``data`` flagged 0 (normal); all of them where ``y`` holds no flags."""
    return data.subset(torch.nonzero(data.y == 0).flatten()) if data.y.dtype == torch.int64 else data


@torch.no_grad()
def _outputs(model: nn.Module, data: ArrayDataset) -> torch.Tensor:
    """``model``'s outputs for every sample of ``data``, flattened per sample (float64), in eval mode."""
    model.eval()
    pieces = [model(data.x[i : i + EVAL_BATCH]).flatten(1).double() for i in range(0, len(data), EVAL_BATCH)]
    work.done().samples_evaluated += len(data)
    return torch.cat(pieces) if pieces else torch.zeros((0, 0), dtype=torch.float64, device=data.x.device)


BUILTIN_TASKS: dict[str, type[Task]] = {t.name: t for t in (Classification, Regression, Anomaly)}


def task_of(settings: SharedSettings) -> Task:
    """The task ``settings`` name, with its options: a built-in, or an installed plugin's :class:`Task` class."""
    if settings.task == Regression.name:
        return Regression(huber=settings.regression_loss == "huber")
    if settings.task == Anomaly.name:
        return Anomaly(quantile=settings.anomaly_quantile)
    if settings.task in BUILTIN_TASKS:
        return BUILTIN_TASKS[settings.task]()
    try:
        made = load_installed("tasks", settings.task)()
    except PluginError as exc:
        raise OperatorError(str(exc)) from None
    if not isinstance(made, Task):
        raise OperatorError(f"task plugin {settings.task!r} is not a dfl_node.learning.tasks.Task subclass")
    return made
