"""Sweeps (``dfl-node sweep GRID.yaml``): a grid of simulator configs × seeds × algorithms, run on a
local process pool or on Ray, each run's result a JSON file, then a summary and plots.

grid.py (the GRID.yaml format, expansion into runs) → driver.py (skip finished runs, run the rest,
report) → pool.py or ray_runner.py (where runs execute) → execute.py (one run) → store.py (result
files, written atomically) → report.py (summary table, CSV, plots).
"""

from dfl_node.sweep.driver import SweepOutcome, run_sweep
from dfl_node.sweep.grid import RunTask, expand

__all__ = ["RunTask", "SweepOutcome", "expand", "run_sweep"]
