"""Model registry: the papers' architectures, built by name from a small spec.

Every node of a fleet builds its model with :func:`build_model` from the same spec and seed, so
all clients start from the same ``w0`` (000, Alg. 1 "Initialization"), and the
:func:`fingerprint` of architecture + parameter names, shapes and dtypes lets two nodes check,
before any transfer, that they can fuse each other's models.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

InputShape = tuple[int, ...]  # one sample's shape: (F,), (C, L), (C, H, W)…
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


def _image_shape(name: str, input_shape: InputShape) -> tuple[int, int, int]:
    """``input_shape`` as (C, H, W), which a 2-D convolution needs; other shapes are a ValueError saying what to use."""
    if len(input_shape) != 3:
        raise ValueError(f"{name} takes image samples (C, H, W); these samples are {tuple(input_shape)}: use mlp "
                         "(any sample shape) or a model of your own (--model package.module:factory)")
    channels, height, width = input_shape
    return channels, height, width


@register("mlp", "000's MLP: input-200-200-classes, ReLU (hidden sizes configurable); samples of any shape")
def _mlp(input_shape: InputShape, num_classes: int, hidden: Sequence[int] | None) -> nn.Module:
    sizes = [math.prod(input_shape), *(hidden or (200, 200))]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], num_classes))
    return nn.Sequential(*layers)


@register("cnn", "000's CNN (FedAvg): two 5x5 conv (32, 64) + 2x2 max-pool, FC 512; for 28x28x1 or 32x32x3")
def _cnn(input_shape: InputShape, num_classes: int, hidden: Sequence[int] | None) -> nn.Module:
    c1, c2, fc = tuple(hidden) if hidden else (32, 64, 512)
    channels, height, width = _image_shape("cnn", input_shape)
    # padding 2 keeps 28→28→14→14→7 (MNIST) and 32→32→16→16→8 (CIFAR-10)
    flat = c2 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, fc), nn.ReLU(), nn.Linear(fc, num_classes),
    )


@register("cnn-ln", "003's CNN family (Table 10): per width a 5x5 conv (padding 2) + ReLU + 2x2 max-pool + "
                    "LayerNorm, then a linear classifier; widths [32, 64] unless given")
def _cnn_ln(input_shape: InputShape, num_classes: int, hidden: Sequence[int] | None) -> nn.Module:
    channels, height, width = _image_shape("cnn-ln", input_shape)
    layers: list[nn.Module] = []
    for out in hidden or (32, 64):
        height, width = height // 2, width // 2
        if not height or not width:
            raise ValueError(f"cnn-ln: {len(hidden or ())} layers pool a {input_shape[1]}x{input_shape[2]} input away")
        layers += [nn.Conv2d(channels, out, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                   nn.LayerNorm([out, height, width])]
        channels = out
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * height * width, num_classes))


_SPEC = re.compile(r"^([a-z][a-z0-9-]*)(?::([0-9]+(?:,[0-9]+)*))?$")


@dataclass(frozen=True)
class ModelSpec:
    """An architecture as a registry name plus its layer widths: ``mlp``, ``mlp:32,32``, ``cnn-ln:32,64,128``.

    This string is all that travels about a peer's model (Hello, transfer headers): a node builds a
    peer's model only from its own registry with this spec, never from code or pickles off the wire.
    """

    name: str
    widths: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        match = _SPEC.match(text.strip())
        if not match or match.group(1) not in _REGISTRY:
            raise ValueError(f"unknown model spec {text!r}: expected NAME[:W1,W2,...] with NAME one of "
                             f"{', '.join(available_models())}")
        widths = tuple(int(w) for w in match.group(2).split(",")) if match.group(2) else None
        if widths is not None and not all(widths):
            raise ValueError(f"model spec {text!r}: widths must be positive")
        return cls(match.group(1), widths)

    def __str__(self) -> str:
        return self.name if self.widths is None else f"{self.name}:{','.join(map(str, self.widths))}"

    def build(self, input_shape: Sequence[int], num_classes: int, *, seed: int = 0,
              device: torch.device | str | None = None) -> nn.Module:
        """The model with ``w0`` from ``seed``; on the ``meta`` device it has shapes but no memory."""
        with torch.device(device or "cpu"):
            return build_model(self.name, input_shape, num_classes, hidden=self.widths, seed=seed)


Shape = tuple[int, ...]


@functools.lru_cache(maxsize=64)  # bounded: the specs come from peers
def tensor_shapes(model: str, input_shape: tuple[int, ...], num_classes: int) -> tuple[tuple[str, Shape], ...]:
    """Tensor names and shapes of registry model ``model`` (a spec's text) for data of ``input_shape`` and
    ``num_classes``: built on the meta device (no memory: a hostile spec of huge widths allocates nothing), once
    per spec — a receiver checks every message it takes against it, and a build costs ~10 ms where a round of
    a small model costs less. A spec the registry cannot build is a ValueError."""
    built = ModelSpec.parse(model).build(input_shape, num_classes, device="meta")
    return tuple((name, tuple(t.shape)) for name, t in built.state_dict().items())


def spread(architectures: Sequence[str], node_ids: Sequence[str]) -> dict[str, str]:
    """003's even assignment of architectures to nodes: node i runs ``architectures[i mod A]``."""
    return {node_id: architectures[i % len(architectures)] for i, node_id in enumerate(node_ids)}


def scaled(spec: ModelSpec, rate: float) -> ModelSpec:
    """A width-scaled sub-model (003 H1, HeteroFL/FedRolex): every layer width times ``rate``, at least 1."""
    if spec.widths is None or not 0 < rate <= 1:
        raise ValueError(f"cannot scale {spec} by {rate}: needs explicit widths and 0 < rate <= 1")
    return ModelSpec(spec.name, tuple(max(1, int(w * rate)) for w in spec.widths))


# 003 Table 10's CNN rows as registry specs: H0 one model, H1 one model at rates 2^0 … 2^-4, H2 unrelated depths.
ARCHITECTURE_MODES: dict[str, tuple[str, ...]] = {
    "h0": ("cnn-ln:32,64",),
    "h1": tuple(str(scaled(ModelSpec("cnn-ln", (128, 256)), 2.0 ** -i)) for i in range(5)),
    "h2": ("cnn-ln:32,64,128,256", "cnn-ln:32,64,128", "cnn-ln:32,64", "cnn-ln:16,32,64", "cnn-ln:8,16,32,64"),
}


_SEEDING = threading.Lock()  # simulations run as threads of one process (--per-device N --streams) build at once


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, *, hidden: Sequence[int] | None = None, seed: int = 0
) -> nn.Module:
    """Build a registered architecture with parameters drawn from ``seed`` (same seed → same ``w0``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    builder, _ = _REGISTRY[name]
    with _SEEDING, torch.random.fork_rng(devices=[]):  # one build at a time: they share torch's CPU generator
        # the CPU generator only, where the model is built: torch.manual_seed also queues a seed for every lazy
        # accelerator backend (CUDA, XPU, MTIA) with a formatted stack trace each, ~4 ms a call under asyncio here
        torch.random.default_generator.manual_seed(seed)
        model = builder(tuple(input_shape), num_classes, hidden)
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
        h.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # zero-copy buffer
    return h.hexdigest()


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
