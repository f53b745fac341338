"""A user's own models, algorithms, datasets and tasks, found in this installation: Python entry points, or a
``package.module:attribute`` reference named on the command line.

Four entry-point groups, declared by a plugin package in its own ``pyproject.toml``::

    [project.entry-points."dfl_node.models"]
    tiny-cnn = "my_fleet.models:tiny_cnn"

A plugin's code is imported only when the operator names it (a flag, a config key, ``dfl-node plugins``), and
only from what is installed here: a peer names a model or an algorithm, and a node refuses a name it cannot
find here (``unknown_model``, ``unknown_algorithm``); nothing a peer sends is ever imported.

Listing reads the installed distributions' metadata and imports nothing, so ``--help`` stays light.
"""

from __future__ import annotations

import functools
import importlib.metadata
import pkgutil
import re
import sys
from typing import Any

GROUPS = {"models": "dfl_node.models", "algorithms": "dfl_node.algorithms", "datasets": "dfl_node.datasets",
          "tasks": "dfl_node.tasks"}

# package.module:attribute, as uvicorn, gunicorn and console scripts name a callable
_REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class PluginError(ValueError):
    """A plugin that cannot be loaded: the one line says which, from where, and why."""


def is_reference(text: str) -> bool:
    """Whether ``text`` is a ``package.module:attribute`` reference (not a registry name)."""
    return bool(_REFERENCE.match(text))


def installed(kind: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The plugins of ``kind`` (a key of :data:`GROUPS`) that installed packages declare, by name; none is
    imported. Two packages declaring one name: the first found wins, as ``importlib.metadata`` orders them."""
    return dict(_installed(GROUPS[kind], tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _installed(group: str, path: tuple[str, ...]) -> tuple[tuple[str, importlib.metadata.EntryPoint], ...]:
    """Read once per ``sys.path``: scanning every distribution's metadata costs milliseconds, and a peer's Hello
    naming a model or an algorithm asks whether it is installed (a package installed into a running process
    is found once its folder joins ``sys.path``; one installed into a folder already there, at the next start)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry in importlib.metadata.entry_points(group=group):
        found.setdefault(entry.name, entry)
    return tuple(found.items())


def load_installed(kind: str, name: str) -> Any:
    """The object the installed plugin ``name`` of ``kind`` declares (its module imported now)."""
    entry = installed(kind).get(name)
    if entry is None:
        raise PluginError(f"no {kind[:-1]} plugin {name!r} is installed (entry-point group {GROUPS[kind]})")
    try:
        return entry.load()
    except Exception as exc:  # the plugin's own import error, whatever it is: one line, not its traceback
        raise PluginError(f"{kind[:-1]} plugin {name!r} ({entry.value}, from {_distribution(entry)}) failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc


def resolve(reference: str) -> Any:
    """The object a ``package.module:attribute`` reference names, imported from this installation."""
    if not is_reference(reference):
        raise PluginError(f"{reference!r} is not a reference of the form package.module:attribute")
    try:
        return pkgutil.resolve_name(reference)
    except ModuleNotFoundError as exc:
        raise PluginError(f"cannot load {reference}: {type(exc).__name__}: {exc} (install its package, or put the "
                          "folder that holds it on PYTHONPATH)") from exc
    except Exception as exc:  # ImportError, AttributeError, or whatever the module raises while it is imported
        raise PluginError(f"cannot load {reference}: {type(exc).__name__}: {exc}") from exc


def origin(entry: importlib.metadata.EntryPoint) -> str:
    """Where an installed plugin comes from: its ``module:attribute`` and its distribution."""
    return f"{entry.value} (from {_distribution(entry)})"


def _distribution(entry: importlib.metadata.EntryPoint) -> str:
    dist = entry.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown package"
