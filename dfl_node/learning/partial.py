"""Partial training across width-scaled models (003 App. A.3.3): index sets (eqs. 7–9) and eq. 6.

A family's models (``cnn-ln:32,64`` and its rate-½ sub-model ``cnn-ln:16,32``, ``mlp:64,32`` and
``mlp:16,8``) differ only in the widths J_i of their hidden layers. A sub-model W_n holds, of every
hidden layer i of the global model W_g, the units X_{n,i} (an ordered index set: unit s of W_n is
unit X_{n,i}[s] of W_g):

* **HeteroFL (eq. 8)**: ``{0, …, ⌊r_n J_i⌋ − 1}``, always the first units;
* **FedRolex (eq. 9)**: a window of ⌊r_n J_i⌋ units starting at t̃ = t mod J_i, wrapping round;
* **Federated Dropout (eq. 7)**: ⌊r_n J_i⌋ distinct units drawn at random (kept in increasing order).

:func:`tensor_indices` turns the layer index sets into each tensor's index along each dimension
(a conv's output and input channels, a LayerNorm's channels, a classifier's flattened input
features), :func:`aggregate_partial` is eq. 6: every element of W_g is the mean of the models that
hold it (003: d_n = 1/|P|, equal weights), and every model then takes its units back from W_g.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from dfl_node.learning.tensors import StateDict

# name -> (layer of dim 0, layer of dim 1, features per unit of dim 1)
TensorLayers = dict[str, tuple[int | None, int | None, int]]


def sub_size(width: int, rate: float) -> int:
    """⌊r·J⌋ of eqs. 7–9 (a hair of tolerance, so that 3/7 of 7 is 3 in floating point)."""
    return math.floor(rate * width + 1e-9)


def heterofl_indices(width: int, size: int) -> torch.Tensor:
    """Eq. 8: ``{0, 1, …, size − 1}`` of a layer of ``width`` units."""
    _check(width, size)
    return torch.arange(size)


def fedrolex_indices(width: int, size: int, round_: int) -> torch.Tensor:
    """Eq. 9: ``{t̃, …, t̃ + size − 1}`` with t̃ = t mod J, wrapping round to ``{0, …}`` past J − 1."""
    _check(width, size)
    return (round_ % width + torch.arange(size)) % width


def dropout_indices(width: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Eq. 7: ``size`` distinct random units of ``width``, in increasing order (drawn from ``generator``)."""
    _check(width, size)
    return torch.randperm(width, generator=generator)[:size].sort().values


def _check(width: int, size: int) -> None:
    if not 0 < size <= width:
        raise ValueError(f"a sub-model layer needs 1 … {width} units, not {size}")


def hidden_widths(model: nn.Module) -> list[int]:
    """J_i: the output width of every weight layer but the classifier, in order."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return [m.out_channels if isinstance(m, nn.Conv2d) else m.out_features for m in layers[:-1]]


def tensor_layers(model: nn.Module) -> TensorLayers:
    """For every tensor of ``model``: which hidden layer its dimension 0 and 1 index (None: not sliced —
    the image channels, the classes), and how many input features one unit of dimension 1 spans (a
    classifier after a conv sees C·H·W features, H·W per channel). Supports sequences of Conv2d,
    Linear and LayerNorm (plus parameterless modules): the registry's ``mlp``, ``cnn`` and ``cnn-ln``."""
    leaves = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    weighted = [m for _, m in leaves if isinstance(m, (nn.Conv2d, nn.Linear))]
    layers: TensorLayers = {}
    current: int | None = None  # the hidden layer the activations belong to (None: the input)
    width = 0
    for name, module in leaves:
        prefix = f"{name}." if name else ""
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            out = None if module is weighted[-1] else (0 if current is None else current + 1)
            fan_in = module.in_channels if isinstance(module, nn.Conv2d) else module.in_features
            per_unit = 1 if current is None else fan_in // width
            if current is not None and per_unit * width != fan_in:
                raise ValueError(f"{name}: {fan_in} inputs do not split over {width} units")
            layers[f"{prefix}weight"] = (out, current, per_unit)
            if module.bias is not None:
                layers[f"{prefix}bias"] = (out, None, 1)
            if out is not None:
                current = out
                width = module.out_channels if isinstance(module, nn.Conv2d) else module.out_features
        elif isinstance(module, nn.LayerNorm):
            for tensor in ("weight", "bias"):
                if getattr(module, tensor) is not None:
                    layers[f"{prefix}{tensor}"] = (current, None, 1)
        elif any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            raise ValueError(f"partial training cannot slice {name} ({type(module).__name__})")
    return layers


def _expand(units: torch.Tensor, per_unit: int) -> torch.Tensor:
    """Feature indices of ``units`` when each unit spans ``per_unit`` consecutive features (flattened C·H·W)."""
    return (units[:, None] * per_unit + torch.arange(per_unit)).reshape(-1)


def tensor_indices(layers: TensorLayers, units: Sequence[torch.Tensor], shapes: Mapping[str, Sequence[int]]
                   ) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each tensor's index along dimensions 0 and 1 in W_g, from the sub-model's units per hidden layer
    (``shapes``: W_g's tensor shapes; unsliced dimensions get every index)."""
    found = {}
    for name, (out, into, per_unit) in layers.items():
        shape = shapes[name]
        dims = [units[out] if out is not None else torch.arange(shape[0])]
        if len(shape) > 1:
            dims.append(_expand(units[into], per_unit) if into is not None else torch.arange(shape[1]))
        found[name] = tuple(dims)
    return found


def _grid(index: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return index if len(index) == 1 else (index[0][:, None], index[1][None, :])


def extract(global_state: Mapping[str, torch.Tensor], indices: Mapping[str, tuple[torch.Tensor, ...]]) -> StateDict:
    """The sub-model's tensors taken from W_g at ``indices``."""
    return {name: global_state[name][_grid(tuple(i.to(global_state[name].device) for i in index))].clone()
            for name, index in indices.items()}


def aggregate_partial(shapes: Mapping[str, Sequence[int]], states: Sequence[Mapping[str, torch.Tensor]],
                      indices: Sequence[Mapping[str, tuple[torch.Tensor, ...]]]) -> StateDict:
    """Eq. 6 with d_n = 1/|P|: each element of W_g is the mean of the models whose index sets hold it
    (summed in the order given: callers sort by node id). An element that no model holds is an error."""
    first = states[0]
    sums = {name: torch.zeros(tuple(shape), dtype=first[name].dtype, device=first[name].device)
            for name, shape in shapes.items()}
    counts = {name: torch.zeros(tuple(shape), dtype=torch.int64, device=first[name].device)
              for name, shape in shapes.items()}
    with torch.no_grad():
        for state, index in zip(states, indices):
            for name in shapes:
                grid = _grid(tuple(i.to(sums[name].device) for i in index[name]))
                sums[name].index_put_(grid, state[name].detach().to(sums[name].dtype), accumulate=True)
                counts[name][grid] += 1
    for name, count in counts.items():
        if bool((count == 0).any()):
            raise ValueError(f"{name}: some elements of the global model belong to no participant")
    return {name: sums[name] / counts[name].to(sums[name].dtype) for name in shapes}
