"""The in-process simulator: the same algorithm objects as the daemon, an in-memory transport."""

from dfl_node.sim.simulator import Simulation, initial_models

__all__ = ["Simulation", "initial_models"]
