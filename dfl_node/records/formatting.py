"""How figures read for people: one way everywhere (``dfl-node status``, the node's log lines, ``/metrics``' names).

A node's headline figure is its task's metric (:mod:`dfl_node.learning.tasks`: accuracy, RMSE, ROC AUC, a plugin's):
:func:`figure` names it and says how it reads, for every place that shows one. ``/status`` keeps carrying it as
``local_accuracy`` and ``global_accuracy`` (the keys clients read since before tasks) and says its name in
``metric``. This module stays light (no torch): ``dfl-node status`` imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Figure", "figure", "format_bytes", "format_data"]

ACCURACY = "accuracy"  # classification's metric, and that of a node older than tasks (its /status has no metric)


@dataclass(frozen=True)
class Figure:
    """What a headline metric is called and how its values read."""

    metric: str  # the task's name of it: "accuracy", "rmse", "auc"
    title: str  # where a sentence starts with it (a metric's help text): "Accuracy", "RMSE"
    short: str  # a narrow table column's: "acc"
    ratio: bool  # a fraction of [0, 1]: Prometheus' ``_ratio`` suffix, and what a peer may claim of it

    @property
    def percent(self) -> bool:
        """Shown as a percentage: an accuracy (an AUC reads as the fraction it is, by custom)."""
        return self.metric == ACCURACY

    def format(self, value: Any) -> str:
        """``0.9123`` as ``91.23%`` (accuracy), ``0.4123`` (another metric, 4 significant digits); ``–`` while
        there is none."""
        if value is None:
            return "–"
        return f"{100 * float(value):.2f}%" if self.percent else f"{float(value):.4g}"

    def plausible(self, value: float | None) -> float | None:
        """A figure as a peer said it, if it can be one (a hostile peer's NaN, or an accuracy of 7.5, is unknown)."""
        if value is None or not math.isfinite(value) or (self.ratio and not 0.0 <= value <= 1.0):
            return None
        return value


# The built-in tasks' metrics; a plugin task's reads as its own name, unbounded (nothing says it is a ratio).
_KNOWN = {f.metric: f for f in (Figure(ACCURACY, "Accuracy", "acc", ratio=True),
                                Figure("rmse", "RMSE", "rmse", ratio=False),
                                Figure("auc", "ROC AUC", "auc", ratio=True))}


def figure(metric: str | None) -> Figure:
    """The figure a node reports as its accuracy, by its task's ``metric`` (``/status``'s; None: a node that
    predates tasks, whose figure is an accuracy)."""
    name = metric or ACCURACY
    return _KNOWN.get(name) or Figure(name, name, name, ratio=False)


def format_bytes(n: Any) -> str:
    """Binary units, one decimal (``1.5 MiB``); ``–`` while there is none."""
    if n is None:
        return "–"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{int(x)} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    raise AssertionError("unreachable")


def format_data(data: Any) -> str | None:
    """A node's data (``/status``'s ``data``) in a line: ``240 + 60 samples (train + val), 3 files, 1 bad file``."""
    if not isinstance(data, dict):
        return None
    files, bad = data.get("files"), data.get("bad_files") or 0
    return (f"{data.get('train_samples')} + {data.get('val_samples')} samples (train + val), {files} "
            f"file{'' if files == 1 else 's'}" + (f", {bad} bad file{'' if bad == 1 else 's'}" if bad else ""))
