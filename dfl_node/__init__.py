"""dfl-node: decentralized federated learning for IoT fleets, with no central server.

Layers (dependencies point down only):
``cli`` → ``sim`` | ``node`` (+ ``api``, ``net``) → ``peering`` → ``algorithms`` → ``learning``.
``node`` talks to its peers only in ``peering``'s types; ``net`` converts them to and from protobuf.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 3
