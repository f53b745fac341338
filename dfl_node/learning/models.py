"""Model registry: the papers' architectures, built by name from a small spec.

Every node of a fleet builds its model with :func:`build_model` from the same spec and seed, so
all clients start from the same ``w0`` (000, Alg. 1 "Initialization"), and the
:func:`fingerprint` of architecture + parameter names, shapes and dtypes lets two nodes check,
before any transfer, that they can fuse each other's models.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

InputShape = tuple[int, int, int]  # (C, H, W)
ModelBuilder = Callable[[InputShape, int, Sequence[int] | None], nn.Module]

_REGISTRY: dict[str, tuple[ModelBuilder, str]] = {}


def register(name: str, description: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Add an architecture under ``name``; later issues add theirs the same way."""

    def wrap(builder: ModelBuilder) -> ModelBuilder:
        _REGISTRY[name] = (builder, description)
        return builder

    return wrap


def available_models() -> dict[str, str]:
    return {name: desc for name, (_, desc) in sorted(_REGISTRY.items())}


@register("mlp", "000's MLP: input-200-200-classes, ReLU (hidden sizes configurable)")
def _mlp(input_shape: InputShape, num_classes: int, hidden: Sequence[int] | None) -> nn.Module:
    sizes = [input_shape[0] * input_shape[1] * input_shape[2], *(hidden or (200, 200))]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], num_classes))
    return nn.Sequential(*layers)


@register("cnn", "000's CNN (FedAvg): two 5x5 conv (32, 64) + 2x2 max-pool, FC 512; for 28x28x1 or 32x32x3")
def _cnn(input_shape: InputShape, num_classes: int, hidden: Sequence[int] | None) -> nn.Module:
    c1, c2, fc = tuple(hidden) if hidden else (32, 64, 512)
    channels, height, width = input_shape
    # padding 2 keeps 28→28→14→14→7 (MNIST) and 32→32→16→16→8 (CIFAR-10)
    flat = c2 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, fc), nn.ReLU(), nn.Linear(fc, num_classes),
    )


def build_model(
    name: str, input_shape: InputShape, num_classes: int, *, hidden: Sequence[int] | None = None, seed: int = 0
) -> nn.Module:
    """Build a registered architecture with parameters drawn from ``seed`` (same seed → same ``w0``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    builder, _ = _REGISTRY[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = builder(tuple(input_shape), num_classes, hidden)  # type: ignore[arg-type]
    return model


def fingerprint(name: str, state: Mapping[str, torch.Tensor]) -> str:
    """Hex sha256 of the architecture name and every tensor's name, shape and dtype (not values)."""
    layout = [name, [[k, list(t.shape), str(t.dtype).removeprefix("torch.")] for k, t in state.items()]]
    return hashlib.sha256(json.dumps(layout, separators=(",", ":")).encode()).hexdigest()


def param_digest(state: Mapping[str, torch.Tensor]) -> str:
    """Hex sha256 of the parameter values: two nodes with equal digests hold bit-identical models."""
    h = hashlib.sha256()
    for name, tensor in state.items():
        h.update(name.encode())
        h.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())  # zero-copy buffer
    return h.hexdigest()


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
