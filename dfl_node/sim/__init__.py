"""The simulator: K of the daemon's own nodes in one process (:mod:`dfl_node.sim.fleet`), on an in-memory peer
network (:mod:`dfl_node.sim.network`) and a virtual clock (:mod:`dfl_node.sim.clock`), their devices and links
costed (:mod:`dfl_node.sim.costs`) and their faults played (:mod:`dfl_node.sim.faults`): ``dfl-node simulate``,
through :func:`~dfl_node.sim.experiment.run_fleet`."""

from dfl_node.sim.experiment import run_fleet

__all__ = ["run_fleet"]
