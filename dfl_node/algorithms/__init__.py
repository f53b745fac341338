"""Algorithms as transport-agnostic protocols of roles (design §1): plan a round, what a sender
transmits, what a receiver does with it, and what goes back. No I/O in this package."""

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext, Pairing, RoundPlan
from dfl_node.algorithms.combo import Combo
from dfl_node.algorithms.defkt import DefKT
from dfl_node.algorithms.fullavg import FullAvg
from dfl_node.config import LearningConfig

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (DefKT, FullAvg, Combo)}


def make_algorithm(name: str, config: LearningConfig) -> Algorithm:
    """The algorithm object both drivers (simulator and daemon) use."""
    try:
        return ALGORITHMS[name](config)
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}") from None


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmError", "NodeContext", "Pairing", "RoundPlan", "make_algorithm"]
