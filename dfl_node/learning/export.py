"""A trained model as files an application loads without dfl-node: safetensors with a card, TorchScript, ONNX.

A node's model is a registry (or plugin) architecture plus its weights. Whoever rebuilds it needs the spec, the
shape of one sample and the width of its output; :class:`ModelCard` carries them (with the node's task, its
round and the digest of the weights) as plain strings, in a safetensors file's metadata, a TorchScript archive's
extra file ``dfl-node.json`` and an ONNX model's ``metadata_props``. Nothing is pickled: a model file is tensors
and text.

Every export computes, from samples ``(N, *sample_shape)`` float32 with a dynamic batch dimension, what the
node's ``POST /predict`` answers from (:attr:`TrainedModel.answering`), by the card's task:

* classification: *logits* ``(N, num_classes)``, float32 (``/predict``'s probabilities are their softmax,
  :func:`probabilities`);
* regression (and a plugin's task): the *values* ``(N, num_classes)``, float32, the model's outputs as they are;
* anomaly: the *scores* ``(N,)``, float64: each sample's mean squared reconstruction error
  (:class:`ReconstructionError`), not the reconstruction, so that an application flags a sample exactly as
  ``/predict`` does: where its score exceeds the card's ``threshold``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import nn

from dfl_node.learning.models import ModelSpec, param_digest, tensor_shapes
from dfl_node.learning.tasks import reconstruction_error

__all__ = ["ANOMALY", "CLASSIFICATION", "ExportFormat", "ModelCard", "ReconstructionError", "TrainedModel",
           "answers", "build_model", "export", "in_layout_order", "probabilities"]

ExportFormat = Literal["safetensors", "torchscript", "onnx"]
FORMAT_TAG = "dfl-node-model/1"  # a card's "format": what wrote it, so a loader can tell other files apart
INPUT = "samples"  # the exports' input name; the output's is TrainedModel.output
# The tasks (dfl_node.learning.tasks' names) whose models answer other than with their outputs as they are
CLASSIFICATION, ANOMALY = "classification", "anomaly"


@dataclass(frozen=True)
class ModelCard:
    """What a loader needs to rebuild a node's model, and where it comes from."""

    spec: str  # the architecture: a registry spec (``mlp:32,32``) as ``--model``/``--hidden`` make it
    sample_shape: tuple[int, ...]  # one sample's shape: (F,), (C, L), (C, H, W)…
    num_classes: int  # the model's output width: classes; regression: targets; anomaly: a sample's values
    fingerprint: str  # architecture + tensor names, shapes and dtypes (what peers compare at Hello)
    node: str
    round: int  # the rounds the node had completed when this model was committed
    sha256: str  # :func:`~dfl_node.learning.models.param_digest` of the weights, in the model's own order
    task: str = CLASSIFICATION  # what the node learns (its --task): what the model's outputs mean
    threshold: float | None = None  # anomaly: a sample whose score exceeds it is flagged (None: another task)

    def metadata(self) -> dict[str, str]:
        """The card as the ``str → str`` metadata a safetensors header (or ONNX ``metadata_props``) holds (no
        ``threshold`` entry where there is none)."""
        fields = asdict(self)
        fields["sample_shape"] = json.dumps(list(self.sample_shape))
        return {"format": FORMAT_TAG, **{key: str(value) for key, value in fields.items() if value is not None}}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str] | None, where: str) -> ModelCard:
        """The card :meth:`metadata` wrote; a missing or malformed entry is a ValueError naming it and ``where``.
        A card without ``task`` is a classifier's (written before tasks); an anomaly card needs its threshold."""
        metadata = metadata or {}
        optional = {"task", "threshold"}
        missing = [key for key in ("format", *cls.__dataclass_fields__) if key not in metadata and key not in optional]
        if missing:
            raise ValueError(f"{where}: no dfl-node model card (metadata lacks {', '.join(missing)})")
        try:
            shape = tuple(int(d) for d in json.loads(metadata["sample_shape"]))
            threshold = float(metadata["threshold"]) if "threshold" in metadata else None
            card = cls(metadata["spec"], shape, int(metadata["num_classes"]), metadata["fingerprint"],
                       metadata["node"], int(metadata["round"]), metadata["sha256"],
                       metadata.get("task", CLASSIFICATION), threshold)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: malformed model card ({exc})") from None
        if not shape or min(shape) < 1 or card.num_classes < 1:
            raise ValueError(f"{where}: malformed model card (sample shape {shape}, {card.num_classes} classes)")
        if card.task == ANOMALY and (threshold is None or math.isnan(threshold)):
            raise ValueError(f"{where}: malformed model card (an anomaly model with no threshold)")
        return card


@dataclass(frozen=True)
class TrainedModel:
    """A committed model: its card and its weights (CPU tensors that nobody changes: share, never write)."""

    card: ModelCard
    state: dict[str, torch.Tensor]

    @cached_property
    def module(self) -> nn.Module:
        """The model, rebuilt from the card's spec with these weights (shared, not copied), in eval mode.
        A weight that does not fit the spec's layout is a ValueError."""
        card = self.card
        return build_model(card.spec, card.sample_shape, card.num_classes, self.state)

    @cached_property
    def answering(self) -> nn.Module:
        """What ``/predict`` answers from and every export computes: the model itself (logits, values), or an
        anomaly model's :class:`ReconstructionError`."""
        return ReconstructionError(self.module).eval() if self.card.task == ANOMALY else self.module

    @property
    def output(self) -> str:
        """The name of :attr:`answering`'s output in an ONNX file: ``logits``, ``values`` or ``scores``."""
        task = self.card.task
        return "logits" if task == CLASSIFICATION else "scores" if task == ANOMALY else "values"

    def to_bytes(self) -> bytes:
        """The safetensors file: the weights, and the card as its metadata."""
        return save(self.state, metadata=self.card.metadata())

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "model file") -> TrainedModel:
        """A model file :meth:`to_bytes` wrote, checked: its card, and weights whose digest is the card's."""
        try:
            state = load(data)
            header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: not a safetensors file ({str(exc)[:120]})") from None
        card = ModelCard.from_metadata(header.get("__metadata__"), where)
        state = in_layout_order(card.spec, card.sample_shape, card.num_classes, state)
        if param_digest(state) != card.sha256:
            raise ValueError(f"{where}: the weights' digest is not the card's sha256 (a damaged file)")
        return cls(card, state)


def build_model(spec: str, sample_shape: tuple[int, ...], num_classes: int,
                state: Mapping[str, torch.Tensor]) -> nn.Module:
    """Registry architecture ``spec`` with the weights ``state`` (shared, not copied), in eval mode, without
    gradients. A weight that does not fit the spec's layout is a ValueError."""
    model = ModelSpec.parse(spec).build(sample_shape, num_classes, device="meta")
    try:
        model.load_state_dict(state, assign=True)
    except RuntimeError as exc:
        raise ValueError(f"the weights do not fit {spec} for samples {sample_shape}: "
                         f"{str(exc).splitlines()[-1].strip()}") from None
    return model.eval().requires_grad_(False)


class ReconstructionError(nn.Module):
    """An autoencoder's anomaly score of each sample (:func:`~dfl_node.learning.tasks.reconstruction_error`, whose
    quantile over the node's validation set is its threshold), ``(N,)`` float64, as one module that traces and
    exports."""

    def __init__(self, autoencoder: nn.Module) -> None:
        super().__init__()
        self.autoencoder = autoencoder

    def forward(self, samples: torch.Tensor) -> torch.Tensor:
        return reconstruction_error(self.autoencoder(samples), samples)


def in_layout_order(spec: str, sample_shape: tuple[int, ...], num_classes: int,
                    state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` in the order of the model's ``state_dict`` (a safetensors file sorts its tensors), which a
    digest depends on; tensors the architecture does not have, or lacks, are a ValueError."""
    names = [name for name, _ in tensor_shapes(spec, tuple(sample_shape), num_classes)]
    if set(names) != set(state):
        odd = sorted(set(names) ^ set(state))
        raise ValueError(f"the weights are not those of {spec} for samples {tuple(sample_shape)} "
                         f"({len(odd)} tensors differ, e.g. {odd[0]!r})")
    return {name: state[name] for name in names}


@torch.inference_mode()
def probabilities(model: nn.Module, samples: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Softmax of ``model``'s logits for ``samples`` ``(N, *sample_shape)``: ``(N, num_classes)``, float32."""
    logits = model(samples)
    if tuple(logits.shape) != (len(samples), num_classes):
        raise ValueError(f"the model answered {tuple(logits.shape)} for {len(samples)} samples, "
                         f"not ({len(samples)}, {num_classes}) logits")
    return torch.softmax(logits.float(), dim=1)


@torch.inference_mode()
def answers(model: TrainedModel, samples: torch.Tensor) -> torch.Tensor:
    """What ``POST /predict`` answers for ``samples`` ``(N, *sample_shape)``: class probabilities ``(N, classes)``
    (classification), anomaly scores ``(N,)`` (anomaly), else the model's values ``(N, num_classes)``. A model
    that answers another shape than its card says is a ValueError."""
    card = model.card
    if card.task == CLASSIFICATION:
        return probabilities(model.module, samples, card.num_classes)
    answered = model.answering(samples)
    expected = (len(samples),) if card.task == ANOMALY else (len(samples), card.num_classes)
    if tuple(answered.shape) != expected:
        raise ValueError(f"the model answered {tuple(answered.shape)} for {len(samples)} samples, not {expected}")
    return answered


def export(model: TrainedModel, fmt: ExportFormat, out: Path) -> None:
    """Write ``model`` to ``out`` as ``fmt``; ONNX needs the ``[export]`` extra (onnx, onnxscript)."""
    if fmt == "safetensors":
        out.write_bytes(model.to_bytes())
    elif fmt == "torchscript":
        _torchscript(model, out)
    else:
        _onnx(model, out)


def _examples(card: ModelCard) -> tuple[torch.Tensor, torch.Tensor]:
    """Two batches of different sizes: tracing on one and checking on the other proves the batch dynamic."""
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(2, *card.sample_shape, generator=generator),
            torch.randn(3, *card.sample_shape, generator=generator))


def _torchscript(model: TrainedModel, out: Path) -> None:
    """Traced (a registry or plugin model need not be scriptable), checked on a batch of another size, and
    saved with the card as the archive's extra file ``dfl-node.json``."""
    traced_on, checked_on = _examples(model.card)
    with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated; libtorch and torch.jit.load read it
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..* is deprecated", category=DeprecationWarning)
        traced = torch.jit.trace(model.answering, traced_on, check_inputs=[(checked_on,)])
        torch.jit.save(traced, str(out), _extra_files={"dfl-node.json": json.dumps(model.card.metadata())})


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The ONNX exporter logs a WARNING per torchvision operator it cannot register when torchvision is not
    installed, its optimiser an INFO line per pass, and it warns of its own internals: none of it is the user's."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _onnx(model: TrainedModel, out: Path) -> None:
    """``torch.onnx.export`` (the ``torch.export`` path, offline) with a dynamic batch dimension, one file (the
    weights inside: fine below ONNX's 2 GB), the card in ``metadata_props``."""
    try:
        import onnx  # noqa: PLC0415 - the [export] extra: only this format needs it
        import onnxscript  # noqa: F401, PLC0415 - torch's exporter needs it; say so before it fails deep inside
    except ImportError as exc:
        raise ValueError(f"ONNX export needs the export extra: pip install 'dfl-node[export]' ({exc})") from None
    traced_on, _ = _examples(model.card)
    with _quiet_exporter():
        program = torch.onnx.export(model.answering, (traced_on,), input_names=[INPUT], output_names=[model.output],
                                    dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True, verbose=False)
    assert program is not None  # dynamo=True returns the program it exported
    proto = program.model_proto
    for key, value in model.card.metadata().items():
        proto.metadata_props.add(key=key, value=value)
    onnx.save_model(proto, str(out))
