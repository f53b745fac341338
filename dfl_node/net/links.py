"""A node's links to its peers over gRPC (the :class:`~dfl_node.peering.port.PeerNetwork` of a daemon):
one :class:`~dfl_node.net.transport.PeerClient` per address, reused for every call, closed once the
peer table forgets the address, so file descriptors and memory stay bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dfl_node.net.auth import Security
from dfl_node.net.transport import PeerClient
from dfl_node.net.wire import WireIdentity
from dfl_node.peering.messages import Hello


class GrpcNetwork:
    def __init__(self, wire: WireIdentity, security: Security, hello_message: Callable[[], Hello], *,
                 connect_timeout: float, retire_after: float) -> None:
        self.wire, self.security, self.hello_message = wire, security, hello_message
        self.connect_timeout = connect_timeout
        self.retire_after = retire_after  # a replaced channel stays open this long: a call may be under way on it
        self.names: dict[str, str] = {}  # mTLS: address -> the node id whose certificate we check there (verified
        # by our Hello, or announced on mDNS)
        self.clients: dict[str, PeerClient] = {}

    def link(self, address: str) -> PeerClient:
        """Our channel to ``address``; with mTLS, one that checks the certificate of the node we know is there."""
        name = self.names.get(address) if self.security.tls else None
        client = self.clients.get(address)
        if client is None or client.checked_id != name:
            if client is not None:  # retired, not cut: a call may still be under way on it
                retired = client
                asyncio.get_running_loop().call_later(self.retire_after, lambda: asyncio.ensure_future(retired.close()))
            client = self.clients[address] = PeerClient(address, self.wire, self.security, name, self.hello_message,
                                                        self.connect_timeout)
        return client

    def forget(self, address: str) -> None:
        """The peer table no longer knows ``address``: close our channel to it."""
        client = self.clients.pop(address, None)
        if client is not None:
            asyncio.get_running_loop().create_task(client.close())

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
