"""What a compromised device does to the values it sends or the data it trains on, as plain functions.

The simulator's adversaries (:mod:`dfl_node.sim.adversaries`) apply these where a compromised device would: to
the tensors of every model that leaves it, or to its own labels. Each is a known attack of the literature on
poisoned federated learning (NEBULA's model and label poisoning; Bagdasaryan et al. 2020's model replacement).
"""

from __future__ import annotations

import torch

from dfl_node.learning.datasets import ArrayDataset


def sign_flipped(values: torch.Tensor, strength: float) -> torch.Tensor:
    """−strength · w: the model pointed the other way (strength 1: its exact negative)."""
    return values * -strength


def scaled(values: torch.Tensor, reference: torch.Tensor, factor: float) -> torch.Tensor:
    """reference + factor · (w − reference): the change since ``reference`` boosted ``factor`` times, as model
    replacement scales an update so that it survives being averaged with the others (factor = group size)."""
    return reference + (values - reference) * factor


def noisy(values: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """w + N(0, sigma²) in every element, drawn on the CPU from ``generator`` (the same on every device)."""
    noise = torch.randn(values.shape, generator=generator, dtype=torch.float32) * sigma
    return values + noise.to(values.device, values.dtype)


def flipped_labels(data: ArrayDataset) -> ArrayDataset:
    """The same samples with every label y replaced by C − 1 − y: a device that trains on mislabelled data."""
    return ArrayDataset(data.x, data.num_classes - 1 - data.y, data.num_classes)
