"""Model registry: the papers' architectures, built by name from a small spec, and a user's own models.

Every node of a fleet builds its model with :func:`build_model` from the same spec and seed, so
all clients start from the same ``w0`` (000, Alg. 1 "Initialization"), and the
:func:`fingerprint` of architecture + parameter names, shapes and dtypes lets two nodes check,
before any transfer, that they can fuse each other's models.

A user's model is a factory ``(sample_shape, num_classes) -> nn.Module``, named by an installed plugin's name
(entry-point group ``dfl_node.models``, :mod:`dfl_node.plugins`) or by the ``package.module:factory`` the node
was configured with (:func:`use_reference`). Its ``w0`` comes from the seed as a built-in's does. A peer's
spec resolves only to what is built in, installed or configured here: a name a peer sends never imports
anything else.
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
from typing import Any

import torch
from torch import nn

from dfl_node.plugins import PluginError, installed, is_reference, load_installed, origin, resolve

InputShape = tuple[int, ...]  # one sample's shape: (F,), (C, L), (C, H, W)…
ModelBuilder = Callable[[InputShape, int, Sequence[int] | None], nn.Module]

_REGISTRY: dict[str, tuple[ModelBuilder, str]] = {}  # built-ins, and the plugins this process has loaded
_PLUGINS: set[str] = set()  # the names in _REGISTRY that are plugins: no widths, their output checked


def register(name: str, description: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Add a built-in architecture under ``name`` (a user's own is a plugin: :mod:`dfl_node.plugins`)."""

    def wrap(builder: ModelBuilder) -> ModelBuilder:
        _REGISTRY[name] = (builder, description)
        return builder

    return wrap


def available_models() -> dict[str, str]:
    """Every model this node can build, by name: the built-ins, a configured ``package.module:factory``, and the
    installed plugins (listed from their packages' metadata, not imported)."""
    found = {name: f"plugin {origin(entry)}" for name, entry in installed("models").items()}
    found.update({name: description for name, (_, description) in _REGISTRY.items()})
    return dict(sorted(found.items()))


def builtin_models() -> dict[str, str]:
    """The package's own architectures, by name."""
    return {name: desc for name, (_, desc) in sorted(_REGISTRY.items()) if name not in _PLUGINS}


def use_reference(reference: str) -> str:
    """Load the ``package.module:factory`` this node is configured with (a flag, a ``DFL_*`` variable, a config
    file) into the registry under that text: from then on, and only then, a peer naming it is understood. A
    missing module or attribute, or an attribute that is not callable, is a one-line :class:`PluginError`."""
    if reference not in _REGISTRY:
        _add_plugin(reference, resolve(reference), reference)
    return reference


def _known(name: str) -> bool:
    return name in _REGISTRY or (not is_reference(name) and name in installed("models"))


def _builder(name: str) -> ModelBuilder:
    """The builder of ``name``; an installed plugin's module is imported now, the first time it is built."""
    if not _known(name):
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}")
    if name not in _REGISTRY:
        entry = installed("models")[name]
        _add_plugin(name, load_installed("models", name), origin(entry))
    return _REGISTRY[name][0]


def _add_plugin(name: str, factory: Any, where: str) -> None:
    if not callable(factory):
        raise PluginError(f"model {name}: {where} is not callable (it is a {type(factory).__name__}); a model "
                          "plugin is a factory (sample_shape, num_classes) -> torch.nn.Module")
    _REGISTRY[name] = (_plugin_builder(name, factory), f"plugin {where}")
    _PLUGINS.add(name)


def _plugin_builder(name: str, factory: Callable[..., Any]) -> ModelBuilder:
    """A plugin's factory as a registry builder: it takes no widths, and what it returns must be a module that
    classifies a batch of the samples into ``num_classes`` scores (checked once per build, so a mistake is the
    one line at start rather than a traceback in the first round)."""

    def build(input_shape: InputShape, num_classes: int, hidden: Sequence[int] | None) -> nn.Module:
        if hidden:
            raise PluginError(f"model {name} is a plugin: it takes no layer widths (--hidden, NAME:W1,W2)")
        try:
            model = factory(input_shape, num_classes)
        except Exception as exc:  # the user's code: whatever it raises is one line, not its traceback
            raise PluginError(f"model {name} failed to build for samples {input_shape} and {num_classes} classes: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module):
            raise PluginError(f"model {name}: its factory returned a {type(model).__name__}, not a torch.nn.Module")
        _check_output(name, model, input_shape, num_classes)
        return model

    return build


def _check_output(name: str, model: nn.Module, input_shape: InputShape, num_classes: int) -> None:
    """A forward pass of two zero samples in eval mode, without gradients (on the device the model is built on;
    on ``meta``, shapes only); the modules' training flags are put back as the factory left them."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros((2, *input_shape)))
    except Exception as exc:  # the user's forward: one line
        raise PluginError(f"model {name} cannot take samples of shape {input_shape}: {type(exc).__name__}: "
                          f"{exc}") from exc
    finally:
        for module, training in modes:
            module.training = training
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != (2, num_classes):
        raise PluginError(f"model {name} gives {got} for a batch of 2 samples of shape {input_shape}; a model for "
                          f"{num_classes} classes must give (2, {num_classes}) scores")


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


_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(?::([0-9]+(?:,[0-9]+)*))?$")


@dataclass(frozen=True)
class ModelSpec:
    """An architecture as a registry name plus its layer widths: ``mlp``, ``mlp:32,32``, ``cnn-ln:32,64,128``;
    or a plugin: an installed one's name (``meter-cnn``), or a ``package.module:factory`` (no widths).

    This string is all that travels about a peer's model (Hello, transfer headers): a node builds a
    peer's model only from its own registry, its installed plugins and the reference it was configured
    with, never from code or pickles off the wire.
    """

    name: str
    widths: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, text: str, *, configured: bool = False) -> ModelSpec:
        """The spec ``text`` names. ``configured``: the text is this node's own setting, not a peer's, so a
        ``package.module:factory`` in it is loaded (:func:`use_reference`); from a peer, a reference is
        understood only if this node was configured with it."""
        text = text.strip()
        if is_reference(text):
            if configured:
                use_reference(text)
            elif text not in _REGISTRY:
                raise ValueError(f"unknown model {text!r}: a package.module:factory model is loaded only where it "
                                 "is configured")
            return cls(text)
        match = _SPEC.match(text)
        if not match or not _known(match.group(1)):
            raise ValueError(f"unknown model spec {text!r}: expected NAME[:W1,W2,...] with NAME one of "
                             f"{', '.join(available_models())}, or package.module:factory")
        name = match.group(1)
        widths = tuple(int(w) for w in match.group(2).split(",")) if match.group(2) else None
        if widths is not None and not all(widths):
            raise ValueError(f"model spec {text!r}: widths must be positive")
        if widths is not None and (name in _PLUGINS or name not in _REGISTRY):
            raise ValueError(f"model spec {text!r}: {name} is a plugin, which takes no widths")
        return cls(name, widths)

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
    """Build a registered architecture or a plugin with parameters drawn from ``seed`` (same seed → same ``w0``)."""
    builder = _builder(name)
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
