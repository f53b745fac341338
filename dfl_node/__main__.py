"""``python -m dfl_node`` is ``dfl-node``."""

from dfl_node.cli import main

if __name__ == "__main__":  # not on import: a spawned worker process (sweeps) imports this module
    main()
