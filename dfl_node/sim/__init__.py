"""The in-process drivers: :class:`Simulation` (K virtual nodes, the daemon's algorithm objects through the same
round runner over an in-memory transport: the fast path) and, in :mod:`dfl_node.sim.fleet`, K of the daemon's
own nodes on an in-memory network and a virtual clock (``dfl-node simulate --mode``)."""

from dfl_node.sim.simulator import Simulation, initial_models

__all__ = ["Simulation", "initial_models"]
