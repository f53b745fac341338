"""A device learning alone: the baseline a fleet's exchanges must beat (``benchmarks/forecast.py``, the
anomaly fleet's test). The device's model starts from the fleet's ``w0`` and trains on its own data only, with the
fleet's settings (architecture, seed, batch size, learning rate, task), for as many passes as it is given."""

from __future__ import annotations

import torch
from torch import nn

from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.tasks import task_of
from dfl_node.learning.training import SgdParams, local_sgd


def trained_alone(learning: SharedSettings, data: ArrayDataset, passes: int) -> nn.Module:
    """A model of the fleet's (its ``w0``) trained on ``data`` alone for ``passes`` passes (``data`` as a node
    reads it: the task takes what it trains on, e.g. an autoencoder's normal samples)."""
    task = task_of(learning)
    train = task.supervised(data)
    model = ModelSpec(learning.model, tuple(learning.hidden) if learning.hidden else None).build(
        train.input_shape, task.outputs(data), seed=learning.seed)
    params = SgdParams(lr=learning.lr, momentum=learning.momentum, batch_size=learning.batch_size, epochs=passes)
    local_sgd(model, train, params, torch.Generator().manual_seed(learning.seed), loss_fn=task.loss)
    return model
