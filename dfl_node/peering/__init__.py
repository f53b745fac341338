"""The peer network port: what a node says to its peers and what it answers them, in the project's own types.

:mod:`.messages` holds the messages (a Hello, a role's :class:`~.messages.Assignment`, the round
:class:`~.messages.Token`, …), :mod:`.errors` the ways a call to a peer fails, :mod:`.probes` the
client-selection probe (001) as it travels, and :mod:`.port` the two halves of the port as protocols:
:class:`~.port.PeerLink` (a node's calls to one peer) and :class:`~.port.PeerHandler` (what a node
answers). :mod:`dfl_node.node` speaks only these; :mod:`dfl_node.net` implements the port over gRPC and
converts to and from protobuf at its edge (:mod:`dfl_node.net.convert`), and an in-memory network can
implement it without any wire. This package imports neither.
"""
