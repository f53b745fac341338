"""What ``--dataset`` names (``simulate``, ``testbed``, ``partition``): a built-in dataset, an installed
``dfl_node.datasets`` plugin, a ``package.module:factory``, or the path of the user's own files. Light on purpose
(no numpy, nothing imported from a plugin): reading settings and drawing ``--help`` use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dfl_node.plugins import installed, is_reference

BUILTIN_DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10")
DATA_SUFFIXES = (".csv", ".npz", ".safetensors")
Kind = Literal["builtin", "plugin", "reference", "path"]


def dataset_names() -> list[str]:
    """The datasets known by name: the built-in ones and the installed plugins (none of them imported)."""
    return [*BUILTIN_DATASETS, *sorted(set(installed("datasets")) - set(BUILTIN_DATASETS))]


def dataset_kind(name: str) -> Kind | None:
    """What ``name`` refers to; None for a name that is none of them (a typo)."""
    if name in BUILTIN_DATASETS:
        return "builtin"
    if name in installed("datasets"):
        return "plugin"
    if is_reference(name):
        return "reference"
    if "/" in name or "\\" in name or Path(name).suffix.lower() in DATA_SUFFIXES or Path(name).exists():
        return "path"
    return None


def check_dataset(name: str) -> str:
    """``name`` if it names a dataset; else the one-line problem (a ValueError, which settings report)."""
    if dataset_kind(name) is None:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(sorted(dataset_names()))}; or your own: "
                         f"the path of a .csv or .npz file or of a folder of them (./data.csv), or "
                         f"package.module:factory")
    return name


def dataset_problem(name: str, data_dir: Path | None) -> tuple[str, str] | None:
    """Why ``name`` cannot be read on this machine, as (setting, problem), or None. A ``--data-dir`` that holds
    files of the user's own while ``name`` is a built-in dataset that reads none of them (digits is embedded) is
    one: ``simulate --data-dir FOLDER-OF-CSV`` would otherwise run digits, silently. (The other built-in datasets
    read the folder, and say what they miss there.)"""
    kind = dataset_kind(name)
    if kind == "path" and not Path(name).exists():
        return "dataset", f"{name}: no such file or folder"
    if name == "digits" and data_dir is not None and data_dir.is_dir():
        own = sorted(p.name for p in data_dir.iterdir() if _users_own(p))
        if own:
            shown = ", ".join(own[:3]) + (", …" if len(own) > 3 else "")
            return "data_dir", (f"{data_dir} holds data files of your own ({shown}), which --dataset digits (embedded) "
                                f"does not read; to use them, give --dataset {data_dir}")
    return None


def _users_own(path: Path) -> bool:
    """A data file that is none of the built-in datasets' (``mnist.npz``, ``fashion_mnist.npz``)."""
    builtin = {f"{name}.npz" for name in BUILTIN_DATASETS}
    return path.suffix.lower() in (".csv", ".npz") and path.name not in builtin and not path.name.startswith(".")
