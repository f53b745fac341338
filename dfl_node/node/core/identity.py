"""What a node's network is built from: the identity of its model, which the network encodes ours by and checks
every received model against, and the Hello it introduces the node with.

The node does not build its network: whoever runs it hands it a :data:`NetworkFactory` — the daemon's composition
root one for gRPC with its security (:mod:`dfl_node.service.wiring`), the simulator one for its memory
(:mod:`dfl_node.sim.fleet`) — which the node calls once its model exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from dfl_node.peering.messages import Hello
from dfl_node.peering.port import PeerNetwork

Layout = Mapping[str, torch.Tensor]  # a model's tensors by name: only their shapes and dtypes count (meta tensors)


@dataclass(frozen=True)
class ModelIdentity:
    """Our swarm and model: its architecture ``model``, its ``fingerprint`` and ``layout``; how our models'
    floating tensors travel (``wire_dtype``); and, for an algorithm that fuses other architectures, ``resolve``,
    which gives another architecture's fingerprint and layout as our registry builds it for our data."""

    swarm: str
    model: str
    fingerprint: str
    layout: Layout
    wire_dtype: str
    resolve: Callable[[str], tuple[str, Layout]] | None = field(default=None, compare=False)

    def fingerprint_of(self, model: str) -> str:
        """The fingerprint a ``model`` model has here; ``ValueError`` for an architecture this node cannot fuse."""
        if model == self.model:
            return self.fingerprint
        if self.resolve is None:
            raise ValueError(f"{model!r} is not our architecture ({self.model})")
        return self.resolve(model)[0]


NetworkFactory = Callable[[ModelIdentity, Callable[[], Hello]], PeerNetwork]  # (our model, our Hello) -> network
