"""Client selection (001, Procedure 2): a sender chooses its receiver among candidates, by what they answer.

The step runs inside the sender's role (:func:`dfl_node.algorithms.runner.play_sender`), after it
trained and before it transmits: the sender builds a :class:`Probe`, every candidate answers it
with a :class:`ProbeAnswer` computed from its current model, and the sender ranks the candidates.
Two modes, both real:

* ``probe-samples`` — 001's own rule. The sender sends its ``selection_samples`` *least certain*
  samples, with their labels, and picks the candidate whose model gets most of them right (ties:
  lower mean cross-entropy on them, then node id). Raw samples leave the device: opt-in, bounded
  (:func:`probe_budget`), and the algorithm logs a warning when it is on.
* ``class-profile`` — privacy-preserving. A candidate answers only with its per-class accuracy on
  its own validation split (its profile: NaN for a class it holds no sample of). The sender weights
  each class by its own errors there and picks the candidate with the highest weighted accuracy
  (ties: node id). No data leaves a device.

Readings of 001's "data with maximum variance", decided here: the sender's model is deterministic
(no dropout: there is no variance across repeated evaluations), and the variance of one softmax
vector across classes is *lowest* where the model is least sure (uniform output) — taken literally it
would pick the samples the sender already knows. So "maximum variance" is read as maximum predictive
uncertainty: the **entropy** of the softmax output, highest first (ties: lower index). Both modes
measure the sender's uncertainty and errors on its **validation** split, with the model it just
trained: after M local epochs the model is confidently right on nearly all of its training data,
so that is where it would find nothing to ask about. Candidates answer with their current model.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.algorithms.base import AlgorithmError, NodeContext
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step
from dfl_node.learning.datasets import ArrayDataset

MODES = ("probe-samples", "class-profile")
MAX_PROBE_SAMPLES = 256  # hard bounds on what a probe may carry, whatever the settings say
MAX_PROBE_BYTES = 512 * 1024


class SelectionError(AlgorithmError):
    """A probe or an answer that breaks the rules (wrong mode, shapes, sizes, values)."""


@dataclass(frozen=True)
class Probe:
    """What a selecting sender asks its candidates. Only ``sender``, ``round``, ``mode``, ``x`` and ``y``
    travel; ``weights`` (class-profile: the sender's per-class error weights) stay on the sender."""

    sender: str
    round: int
    mode: str
    x: torch.Tensor | None = None  # probe-samples: float32 [n, C, H, W]
    y: torch.Tensor | None = None  # probe-samples: int64 [n]
    weights: tuple[float, ...] = ()

    @property
    def samples(self) -> int:
        return 0 if self.y is None else int(self.y.numel())


@dataclass(frozen=True)
class ProbeAnswer:
    """A candidate's answer: its score on the probe samples, or its per-class validation accuracy."""

    candidate: str
    samples: int = 0  # probe-samples: how many it scored (all of them)
    correct: int = 0
    loss: float = 0.0  # mean cross-entropy on them
    class_accuracy: tuple[float, ...] = ()  # class-profile: one per class, NaN where it holds no sample


def probe_budget(requested: int, input_shape: Sequence[int]) -> int:
    """How many float32 samples of ``input_shape`` a probe carries: as requested, within both hard bounds."""
    per_sample = 4 * math.prod(input_shape)
    return max(0, min(requested, MAX_PROBE_SAMPLES, MAX_PROBE_BYTES // per_sample))


@torch.no_grad()
def _logits(model: nn.Module, x: torch.Tensor, batch_size: int = 2048) -> torch.Tensor:
    model.eval()
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def least_certain(model: nn.Module, data: ArrayDataset, count: int) -> torch.Tensor:
    """Indices of the ``count`` samples of ``data`` with the highest softmax entropy, highest first."""
    if count <= 0 or not len(data):
        return torch.empty(0, dtype=torch.int64)
    log_p = F.log_softmax(_logits(model, data.x), dim=1)
    entropy = -(log_p.exp() * log_p).sum(1)
    return torch.argsort(-entropy, stable=True)[:count]


def per_class(model: nn.Module, data: ArrayDataset, num_classes: int) -> tuple[list[int], list[int]]:
    """(errors, samples) per class of ``model`` on ``data``."""
    errors, held = [0] * num_classes, [0] * num_classes
    if len(data):
        wrong = _logits(model, data.x).argmax(1) != data.y
        for c in range(num_classes):
            mine = data.y == c
            held[c], errors[c] = int(mine.sum()), int((wrong & mine).sum())
    return errors, held


def class_accuracy(model: nn.Module, data: ArrayDataset, num_classes: int) -> tuple[float, ...]:
    """Accuracy per class on ``data``; NaN for a class ``data`` holds no sample of."""
    errors, held = per_class(model, data, num_classes)
    return tuple((h - e) / h if h else math.nan for e, h in zip(errors, held))


def error_weights(errors: Sequence[int], held: Sequence[int]) -> tuple[float, ...]:
    """The sender's class weights for ``class-profile``: its errors per class plus one (so a sender
    without errors still prefers candidates strong on its own classes), 0 for classes it does not hold."""
    raw = [e + 1.0 if h else 0.0 for e, h in zip(errors, held)]
    total = sum(raw)
    return tuple(r / total for r in raw) if total else tuple(raw)


def rank_by_samples(answers: Mapping[str, ProbeAnswer]) -> list[str]:
    """probe-samples: most probe samples right first, then lower loss on them, then node id."""
    return sorted(answers, key=lambda c: (-answers[c].correct, answers[c].loss, c))


def profile_score(weights: Sequence[float], accuracy: Sequence[float]) -> float:
    """Σ_k w_k · acc_k over the sender's classes; a class the candidate holds no sample of counts 0."""
    return math.fsum(w * (0.0 if math.isnan(a) else a) for w, a in zip(weights, accuracy))


def rank_by_profile(weights: Sequence[float], answers: Mapping[str, ProbeAnswer]) -> list[str]:
    """class-profile: highest error-weighted class accuracy first, then node id."""
    scores = {c: profile_score(weights, a.class_accuracy) for c, a in answers.items()}
    return sorted(scores, key=lambda c: (-scores[c], c))


def check_probe(probe: Probe, input_shape: Sequence[int], num_classes: int, mode: str) -> None:
    """A received probe must be of our mode, and its samples of our data's shape, bounded and finite."""
    if probe.mode != mode:
        raise SelectionError(f"probe of mode {probe.mode!r}, this node selects by {mode!r}")
    if mode == "class-profile":
        if probe.x is not None or probe.y is not None:
            raise SelectionError("a class-profile probe carries no samples")
        return
    x, y = probe.x, probe.y
    if x is None or y is None:
        raise SelectionError("a probe-samples probe without samples")
    if x.dtype != torch.float32 or y.dtype != torch.int64 or y.dim() != 1:
        raise SelectionError(f"probe samples must be float32 with int64 labels, got {x.dtype} / {y.dtype}")
    n = y.numel()
    if not 1 <= n <= probe_budget(MAX_PROBE_SAMPLES, input_shape) or tuple(x.shape) != (n, *input_shape):
        raise SelectionError(f"probe samples of shape {tuple(x.shape)}: "
                             f"expected (n, {', '.join(map(str, input_shape))})"
                             f" with 1 ≤ n ≤ {probe_budget(MAX_PROBE_SAMPLES, input_shape)}")
    if int(y.min()) < 0 or int(y.max()) >= num_classes or not bool(torch.isfinite(x).all()):
        raise SelectionError(f"probe labels outside 0..{num_classes - 1} or non-finite samples")


def check_answer(answer: ProbeAnswer, probe: Probe, num_classes: int) -> None:
    """A candidate's answer must answer *this* probe, with values that can be what it says they are."""
    if probe.mode == "probe-samples":
        if answer.samples != probe.samples or not 0 <= answer.correct <= answer.samples or answer.class_accuracy:
            raise SelectionError(f"{answer.candidate} answered {answer.correct}/{answer.samples} to a probe of "
                                 f"{probe.samples} samples")
        if not (math.isfinite(answer.loss) and answer.loss >= 0):
            raise SelectionError(f"{answer.candidate} answered a loss of {answer.loss}")
        return
    acc = answer.class_accuracy
    if len(acc) != num_classes or any(not (math.isnan(a) or 0.0 <= a <= 1.0) for a in acc) or answer.samples:
        raise SelectionError(f"{answer.candidate}'s class profile is not {num_classes} accuracies in [0, 1]")


class SelectsReceiver:
    """The selection roles of an algorithm whose plans have open groups (mixed into an :class:`Algorithm`).

    Driver-agnostic like the rest: the runner calls :meth:`probe` on the sender, :meth:`answer` on
    each candidate (in memory, or behind the daemon's Probe RPC) and :meth:`rank` on the sender.
    """

    @property
    @abstractmethod
    def selection_mode(self) -> str:
        """One of :data:`MODES` (what probes and answers this algorithm exchanges)."""

    @abstractmethod
    def probe(self, ctx: NodeContext, step: Step, message: ModelMessage) -> Probe:
        """Sender: what to ask the candidates, given the model it is about to transmit."""

    @abstractmethod
    def answer(self, ctx: NodeContext, probe: Probe) -> ProbeAnswer:
        """Candidate: the answer of its current model (raise :class:`SelectionError` for a bad probe)."""

    @abstractmethod
    def rank(self, ctx: NodeContext, step: Step, probe: Probe, answers: Mapping[str, ProbeAnswer]) -> list[str]:
        """Sender: the candidates that answered, best first."""
