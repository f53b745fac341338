"""A node's learning context at its smallest, for algorithm tests that need no fleet: a tiny MLP's settings
(:data:`TINY_SETTINGS`) and a node of it on random data (:func:`tiny_context`)."""

from __future__ import annotations

import torch

from dfl_node.algorithms import NodeContext
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.models import ModelSpec

TINY_SETTINGS = SharedSettings(batch_size=8, mkt_batch_size=8, lr=0.1, hidden=[16])


def tiny_context(node_id: str, seed: int = 0) -> NodeContext:
    """Node ``node_id`` of a tiny MLP on 40 random 8x8 samples (32 to train, 8 to validate), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    data = ArrayDataset(torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 10, (40,), generator=g), 10)
    spec = ModelSpec("mlp", (16,))
    return NodeContext(node_id, spec.build((1, 8, 8), 10, seed=0), spec, data.subset(range(32)),
                       data.subset(range(32, 40)), TINY_SETTINGS)
