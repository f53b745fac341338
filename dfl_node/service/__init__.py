"""The process's composition root for ``dfl-node start``: where a node gets its network — gRPC, mDNS, mutual TLS
or the swarm key (:mod:`.wiring`) — and its REST API, and is started and stopped in order (:mod:`.run`). The node
(:mod:`dfl_node.node`) knows none of these; the simulator (:mod:`dfl_node.sim`) composes the same node with its
memory network and virtual clock instead.
"""
