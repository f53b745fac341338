"""``python -m dfl_node`` is ``dfl-node``."""

from dfl_node.cli import main

main()
