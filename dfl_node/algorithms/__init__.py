"""Algorithms as transport-agnostic protocols of roles: plan a round's groups, what a
sender transmits, how an aggregator fuses a group's messages, and what goes back. No I/O here."""

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
from dfl_node.learning.settings import LearningConfig

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (DefKT, FullAvg, Combo, FedAvg, FedProx, Gossip,
                                                                      DefKTSelect, FairAvg)}
ALGORITHMS.update({cls.name: cls for cls in (DFML, HeteroFL, FedRolex, FedDropout, FML)})  # 003, 004


def make_algorithm(name: str, config: LearningConfig) -> Algorithm:
    """The algorithm object both drivers (simulator and daemon) use."""
    try:
        return ALGORITHMS[name](config)
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}") from None


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmError", "Group", "NodeContext", "NodeProfile", "Role", "RoundPlan",
           "Step", "make_algorithm"]
