"""The records a node keeps — its history, refusals, fleet events, peer table rows, counters, status snapshot and
metrics — below the node that writes them and everything that reads them: the REST API serves them, the simulator's
results and the checkpoint store them, so none of those depends on another to name them. Imports nothing of the
node, the API, the networks or the simulator (tests/test_layers.py); this file imports nothing at all, so that
``dfl-node status`` may read :mod:`dfl_node.records.formatting` without pydantic.
"""
