"""A throwaway plugin package, installed for real: a package and its ``*.dist-info`` (``METADATA``,
``entry_points.txt``) in a folder, which ``importlib.metadata`` reads as an installed distribution once the folder
is on ``sys.path`` (this process) or ``PYTHONPATH`` (a daemon's) — what ``pip install --target`` leaves."""

from __future__ import annotations

import textwrap
from pathlib import Path

# The package's code: models of any sample shape, an algorithm, and the mistakes a user's factory makes.
CODE = '''
import math

from torch import nn

from dfl_node.algorithms.defkt import DefKT


def tiny(sample_shape, num_classes):
    """Flatten, one hidden layer with LayerNorm: samples of any shape."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(sample_shape), 24), nn.LayerNorm(24), nn.ReLU(),
                         nn.Linear(24, num_classes))


class PluginKT(DefKT):
    name = "plugin-kt"


NOT_CALLABLE = 42


def returns_none(sample_shape, num_classes):
    return None


def wrong_output(sample_shape, num_classes):
    return nn.Flatten()  # (batch, features), not (batch, classes)


def refuses(sample_shape, num_classes):
    raise ValueError(f"samples {sample_shape} are not what this model is for")
'''


def install_plugin(folder: Path, package: str, *, models: dict[str, str] | None = None,
                   algorithms: dict[str, str] | None = None, version: str = "0.1.0") -> Path:
    """Write ``package`` (module ``package``, distribution ``package`` with dashes) declaring ``models`` and
    ``algorithms`` (entry-point name -> attribute of :data:`CODE`) into ``folder``; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{package}.py").write_text(textwrap.dedent(CODE))
    dist = package.replace("_", "-")
    info = folder / f"{package}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    groups = {"dfl_node.models": models or {}, "dfl_node.algorithms": algorithms or {}}
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {package}:{attribute}\n" for name, attribute in entries.items()) + "\n"
        for group, entries in groups.items() if entries))
    return folder
