"""``dfl-node export STATE_DIR --out FILE [--format safetensors|torchscript|onnx]``: a node's trained model, from its
state folder, as a file an application loads without dfl-node (:mod:`dfl_node.learning.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import click

from dfl_node.errors import OperatorError
from dfl_node.learning.export import ANOMALY, CLASSIFICATION, ExportFormat, ModelCard, export
from dfl_node.node.model.persistence import read_trained

SUFFIXES: dict[str, ExportFormat] = {".safetensors": "safetensors", ".pt": "torchscript", ".ts": "torchscript",
                                     ".onnx": "onnx"}


@click.command("export")
@click.argument("state_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The file to write (replaced if it exists).")
@click.option("--format", "fmt", type=click.Choice(get_args(ExportFormat)), default=None,
              help="safetensors: the weights and their card (what GET /model serves); torchscript: for "
                   "torch.jit.load or libtorch; onnx: for onnxruntime (needs the export extra). "
                   f"[default: from --out's suffix: {', '.join(SUFFIXES)}]")
def export_model(state_dir: Path, out: Path, fmt: ExportFormat | None) -> None:
    """Write a node's trained model as a file: the model of the node whose --state-dir is STATE_DIR (its newest
    checkpoint that verifies; the node may be running), to --out. Every format computes, from samples (N, *sample
    shape) float32 for any batch size N, what the node's POST /predict answers from, by its task: logits
    (N, classes) of a classifier; the values (N, targets) of a regressor; the anomaly scores (N,) float64 of an
    anomaly detector (each sample's mean squared reconstruction error: flag those above the file's threshold).
    The file says the spec, sample shape, outputs, task (and threshold), node, round and digest of the weights.
    A model of your own is imported as the node imported it: an installed plugin, or a package.module:factory
    from PYTHONPATH."""
    fmt = fmt or SUFFIXES.get(out.suffix.lower())
    if fmt is None:
        raise click.BadParameter(f"cannot tell the format from {out.name!r}: give --format or a suffix of "
                                 f"{', '.join(SUFFIXES)}", param_hint="--out")
    try:
        model = read_trained(state_dir)
    except OperatorError as exc:
        raise click.BadParameter(str(exc), param_hint="STATE_DIR") from None
    try:
        export(model, fmt, out)
    except (ValueError, OSError) as exc:  # no [export] extra, an architecture the exporter cannot take, the disk
        raise OperatorError(f"cannot export to {out}: {exc}") from None
    card = model.card
    click.echo(f"wrote {out} ({fmt}): {card.spec} for samples {list(card.sample_shape)}, {_answers(card)}; "
               f"{card.node} at round {card.round}, weights sha256 {card.sha256[:16]}…")


def _answers(card: ModelCard) -> str:
    """What the exported model answers, in a few words: ``10 classes``, ``2 values (regression)``, ``anomaly
    scores, flagged above 0.0123``."""
    if card.task == CLASSIFICATION:
        return f"{card.num_classes} classes"
    if card.task == ANOMALY:
        return f"anomaly scores, flagged above {card.threshold:.4g}"
    return f"{card.num_classes} value{'' if card.num_classes == 1 else 's'} ({card.task})"
