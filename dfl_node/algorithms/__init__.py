"""Algorithms as transport-agnostic protocols of roles: plan a round's groups, what a
sender transmits, how an aggregator fuses a group's messages, and what goes back. No I/O here.

The built-ins are :data:`ALGORITHMS`; a user's own is an :class:`Algorithm` subclass that an installed package
declares in the entry-point group ``dfl_node.algorithms`` (:mod:`dfl_node.plugins`), named like a built-in
everywhere (``--algorithm NAME``), and imported only when a node runs it.
"""

from collections.abc import Iterable

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext
from dfl_node.algorithms.combo import Combo
from dfl_node.algorithms.defkt import DefKT
from dfl_node.algorithms.defkt_select import DefKTSelect
from dfl_node.algorithms.dfml import DFML
from dfl_node.algorithms.fairavg import FairAvg
from dfl_node.algorithms.fedavg import FedAvg, FedProx
from dfl_node.algorithms.fml import FML
from dfl_node.algorithms.fullavg import FullAvg
from dfl_node.algorithms.gossip import Gossip
from dfl_node.algorithms.partial import FedDropout, FedRolex, HeteroFL
from dfl_node.algorithms.plan import Group, NodeProfile, Role, RoundPlan, Step
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.plugins import PluginError, installed, load_installed, origin

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (DefKT, FullAvg, Combo, FedAvg, FedProx, Gossip,
                                                                      DefKTSelect, FairAvg)}
ALGORITHMS.update({cls.name: cls for cls in (DFML, HeteroFL, FedRolex, FedDropout, FML)})  # 003, 004


def algorithm_names() -> list[str]:
    """The built-ins and the installed plugins (read from the packages' metadata: none is imported)."""
    return sorted({*ALGORITHMS, *installed("algorithms")})


def is_algorithm(name: str) -> bool:
    """Whether ``name`` is a built-in or an installed algorithm (asked of every member a node learns: no sort)."""
    return name in ALGORITHMS or name in installed("algorithms")


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of algorithm ``name``: a built-in, or an installed plugin, imported now."""
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    if name not in installed("algorithms"):
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(algorithm_names())}")
    found = load_installed("algorithms", name)
    if not (isinstance(found, type) and issubclass(found, Algorithm)):
        raise PluginError(f"algorithm plugin {name!r}: {origin(installed('algorithms')[name])} is not a subclass of "
                          "dfl_node.algorithms.Algorithm")
    return found


def check_task(algorithms: Iterable[str], task: str) -> None:
    """A ``ValueError`` (one line) where one of ``algorithms`` cannot learn ``task``: checked at start (where the
    task is not classification, which every algorithm learns)."""
    refusals = [refusal for name in algorithms if (refusal := algorithm_class(name).task_refusal(task))]
    if refusals:
        raise ValueError("; ".join(refusals))


def make_algorithm(name: str, config: SharedSettings, options: AlgorithmOptions | None = None) -> Algorithm:
    """Algorithm ``name`` on a node that learns as ``config`` says, given its own settings of ``options`` (every
    algorithm's; None: the defaults) and no other algorithm's."""
    cls = algorithm_class(name)
    own = set(cls.settings_model.model_fields)
    return cls(config, cls.settings_model.model_validate((options or AlgorithmOptions()).model_dump(include=own)))


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmError", "Group", "NodeContext", "NodeProfile", "Role", "RoundPlan",
           "Step", "algorithm_class", "algorithm_names", "is_algorithm",
           "make_algorithm"]
