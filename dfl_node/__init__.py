"""dfl-node: decentralized federated learning for IoT fleets, with no central server.

Layers (dependencies point down only):
``cli`` → ``sim`` | ``node`` (+ ``api``, ``net``) → ``algorithms`` → ``learning``.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 2
