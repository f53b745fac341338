"""Evaluating many models on one dataset at once (issue 10: the simulator at paper scale).

Why: every few rounds a simulator evaluates all K nodes' models on the same global test set; one
model at a time (:func:`dfl_node.learning.training.evaluate`) that is most of its wall time.
:func:`evaluate_many` groups the models by architecture and runs each group as one computation:

* **stacked** (an ``nn.Sequential`` of layers listed in ``_stack_layer``, e.g. the registry's ``mlp``
  and ``cnn``): the group runs as one wider network. The input is shared, so a first convolution's
  im2col and a first linear layer's input are computed once for all models; later convolutions
  are one grouped convolution (each model's channels a group), linear layers one batched matmul,
  activations and pooling run on all models' channels at once, in channels-last layout, which
  CPU pooling and convolution kernels are fastest in.
* **vmap** (any other architecture): ``torch.func.stack_module_state`` + ``functional_call`` +
  ``vmap``, the generic way to batch identical modules.
* a group of one model: the plain loop, ``training.evaluate``.

Results equal the loop's up to float rounding (the sums run in another order): losses to ~1e-6
relative, accuracies exactly unless a sample's two top logits are within rounding of each other,
where the argmax may flip (one sample).

Memory stays bounded: a step holds G models × B samples of activations, and G and B are chosen so
that the estimated peak (:func:`activation_bytes`) stays under ``memory_budget``. Small steps are
no loss on a CPU: activations that stay in cache are faster than one big batch (measured in
``benchmarks/eval_speed.py``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

from dfl_node.learning import work
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.training import Evaluation, evaluate

DEFAULT_MEMORY_BUDGET = 64 * 2**20  # bytes of stacked activations per step; cache-sized steps are fastest on CPU
MIN_BATCH = 32  # fewer samples per step than this and per-call overhead dominates; fewer models per step instead

Forward = Callable[[torch.Tensor], torch.Tensor]  # (B, ...) inputs → (G, B, classes) logits


def evaluate_many(
    models: Sequence[nn.Module], data: ArrayDataset, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> list[Evaluation]:
    """Accuracy and mean cross-entropy of each model on ``data``, in the order of ``models``.

    Same results as ``[training.evaluate(m, data) for m in models]`` up to float rounding (see the
    module docstring); every model is put in eval mode, as ``evaluate`` does. ``memory_budget``
    bounds the bytes of activations one step of a group holds.
    """
    results: list[Evaluation | None] = [None] * len(models)
    for indices in group_by_architecture(models).values():
        group = [models[i] for i in indices]
        evaluations = [evaluate(group[0], data)] if len(group) == 1 else _evaluate_group(group, data, memory_budget)
        for i, evaluation in zip(indices, evaluations):
            results[i] = evaluation
    return [r for r in results if r is not None]


def architecture_key(model: nn.Module) -> Hashable:
    """What must be equal for two models to run as one: each submodule's name, class and
    configuration (``extra_repr``: kernel sizes, strides, paddings…) and each tensor's name, shape
    and dtype. Parameter values may differ."""
    modules = tuple((name, type(m).__module__, type(m).__qualname__, m.extra_repr())
                    for name, m in model.named_modules())
    tensors = tuple((name, tuple(t.shape), t.dtype, t.device) for name, t in model.state_dict().items())
    return modules, tensors


def group_by_architecture(models: Sequence[nn.Module]) -> dict[Hashable, list[int]]:
    """Indices of ``models`` per architecture, in first-seen order."""
    groups: dict[Hashable, list[int]] = {}
    for i, model in enumerate(models):
        groups.setdefault(architecture_key(model), []).append(i)
    return groups


@torch.no_grad()
def activation_bytes(model: nn.Module, sample: torch.Tensor) -> int:
    """Estimated peak activation bytes of one model on one sample: in a no-grad forward a layer's
    input and output live at once, so twice the largest output of any leaf module (at least the input)."""
    largest = sample[:1].numel() * sample.element_size()

    def record(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal largest
        if isinstance(output, torch.Tensor):
            largest = max(largest, output.numel() * output.element_size())

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(record) for m in leaves]
    try:
        model.eval()
        model(sample[:1])
    finally:
        for hook in hooks:
            hook.remove()
    return 2 * largest


def step_shape(num_models: int, num_samples: int, per_sample: int, memory_budget: int) -> tuple[int, int]:
    """(models, samples) per step with ``models × samples × per_sample ≤ memory_budget`` where possible:
    all models at once with at least ``MIN_BATCH`` samples if that fits, else fewer models."""
    per_sample = max(per_sample, 1)
    floor = min(MIN_BATCH, num_samples)
    models = max(1, min(num_models, memory_budget // (floor * per_sample)))
    samples = max(floor, min(num_samples, memory_budget // (models * per_sample)))
    return models, max(samples, 1)


@torch.no_grad()
def _evaluate_group(models: list[nn.Module], data: ArrayDataset, memory_budget: int) -> list[Evaluation]:
    for model in models:
        model.eval()
    per_sample = activation_bytes(models[0], data.x)
    chunk, batch = step_shape(len(models), len(data), per_sample, memory_budget)
    results: list[Evaluation] = []
    for start in range(0, len(models), chunk):
        results += _evaluate_stack(models[start : start + chunk], data, batch)
    return results


def _evaluate_stack(models: list[nn.Module], data: ArrayDataset, batch: int) -> list[Evaluation]:
    """Evaluate models of one architecture together, ``batch`` samples per step."""
    forward = stacked_forward(models, data.x) or vmap_forward(models)
    count = len(models)
    correct = torch.zeros(count, dtype=torch.int64, device=data.x.device)
    loss_sum = torch.zeros(count, dtype=torch.float64, device=data.x.device)
    for start in range(0, len(data), batch):
        x, y = data.x[start : start + batch], data.y[start : start + batch]
        logits = forward(x)  # (G, B, classes)
        losses = F.cross_entropy(logits.flatten(0, 1), y.repeat(count), reduction="none").view(count, -1)
        loss_sum += losses.sum(1, dtype=torch.float64)
        correct += (logits.argmax(-1) == y).sum(1)
    n = max(len(data), 1)
    work.DONE.samples_evaluated += len(data) * count
    return [
        Evaluation(accuracy=int(c) / n, loss=float(s) / n, samples=len(data)) for c, s in zip(correct, loss_sum)
    ]


def vmap_forward(models: list[nn.Module]) -> Forward:
    """Any architecture: parameters and buffers stacked, one ``functional_call`` vmapped over them."""
    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")  # structure only; the values come from the stacks

    def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(skeleton, (p, b), (x,))

    batched = torch.vmap(one, in_dims=(0, 0, None))
    return lambda x: batched(params, buffers, x)


# --- the stacked path --------------------------------------------------------------------------------

Layout = Literal["shared", "channels", "features"]


@dataclass(frozen=True)
class _Act:
    """Activations of G models in one tensor. ``shared``: (N, …), the same for every model (the input,
    before the first layer with parameters); ``channels``: (N, G·C, H, W), model g owning channels
    g·C … (g+1)·C − 1; ``features``: (G, N, F)."""

    data: torch.Tensor
    layout: Layout


Step = Callable[[_Act], _Act]


class _Unsupported(Exception):
    """A layer (or a layer in this position) the stacked path does not know: the group uses vmap."""


_ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardtanh,
                nn.Identity, nn.Dropout)
_PER_CHANNEL = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Dropout2d)


def stacked_forward(models: list[nn.Module], sample: torch.Tensor) -> Forward | None:
    """The group as one wider network, or None if its architecture is not a stackable ``nn.Sequential``.

    Whether layouts fit together depends on the layer types alone, so a forward that runs on one
    ``sample`` (a real input row) runs on all; any other architecture gets None and uses vmap."""
    if not all(isinstance(m, nn.Sequential) for m in models):
        return None
    try:
        steps = [_stack_layer(list(layers)) for layers in _pool_before_relu(list(zip(*models)))]
    except _Unsupported:
        return None

    def forward(x: torch.Tensor) -> torch.Tensor:
        act = _Act(x, "shared")
        for step in steps:
            act = step(act)
        if act.layout != "features" or act.data.ndim != 3:
            raise _Unsupported(f"output in {act.layout} layout")
        return act.data

    try:
        forward(sample[:1])
    except _Unsupported:
        return None
    return forward


def _pool_before_relu(positions: list[tuple[nn.Module, ...]]) -> list[tuple[nn.Module, ...]]:
    """ReLU then MaxPool2d as MaxPool2d then ReLU: equal exactly (ReLU is monotone, so it commutes
    with max), and the ReLU touches a quarter of the values."""
    out = list(positions)
    for i in range(len(out) - 1):
        if isinstance(out[i][0], nn.ReLU) and isinstance(out[i + 1][0], nn.MaxPool2d):
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def _stack_layer(layers: list[nn.Module]) -> Step:
    """The step that applies position i of every model (``layers``: that layer of each model)."""
    first = layers[0]
    if isinstance(first, nn.Conv2d) and first.padding_mode == "zeros":
        return _conv_step(layers)
    if isinstance(first, nn.Linear):
        return _linear_step(layers)
    if isinstance(first, nn.BatchNorm2d) and first.running_mean is not None:
        return _batchnorm_step(layers)
    if isinstance(first, nn.LayerNorm):
        return _layernorm_step(layers)
    if isinstance(first, nn.Flatten) and first.start_dim == 1 and first.end_dim == -1:
        return lambda act: _flatten(act, len(layers))
    if isinstance(first, nn.ReLU):  # in place on activations of our own, never on the caller's input
        return lambda act: _Act(act.data.relu() if act.layout == "shared" else act.data.relu_(), act.layout)
    if isinstance(first, _ELEMENTWISE) and not getattr(first, "inplace", False):
        return lambda act: _Act(first(act.data), act.layout)
    if isinstance(first, _PER_CHANNEL):
        return lambda act: _per_channel(first, act)
    raise _Unsupported(type(first).__name__)


def _per_channel(layer: nn.Module, act: _Act) -> _Act:
    if act.layout == "features":
        raise _Unsupported(f"{type(layer).__name__} after Flatten")
    return _Act(layer(act.data), act.layout)


def _to_channels(act: _Act, count: int) -> torch.Tensor:
    """A shared image batch repeated for each model: (N, C, H, W) → (N, G·C, H, W)."""
    if act.layout == "channels":
        return act.data
    if act.layout == "shared" and act.data.ndim == 4:
        return act.data.repeat(1, count, 1, 1)
    raise _Unsupported("a convolution needs image activations")


def _conv_step(layers: list[nn.Module]) -> Step:
    convs: list[nn.Conv2d] = layers  # type: ignore[assignment]
    conv, count = convs[0], len(convs)
    weight = torch.cat([c.weight for c in convs])  # (G·Cout, Cin/groups, kh, kw)
    bias = torch.cat([cast(torch.Tensor, c.bias) for c in convs]) if conv.bias is not None else None
    grouped = weight.contiguous(memory_format=torch.channels_last)
    shared_im2col = conv.groups == 1 and not isinstance(conv.padding, str)
    matrix = weight.flatten(1).T.contiguous() if shared_im2col else None  # (Cin·kh·kw, G·Cout)

    def step(act: _Act) -> _Act:
        if act.layout == "shared" and matrix is not None and act.data.ndim == 4:
            return _Act(_im2col_conv(conv, act.data, matrix, bias), "channels")
        x = _to_channels(act, count).contiguous(memory_format=torch.channels_last)
        out = F.conv2d(x, grouped, bias, conv.stride, conv.padding, conv.dilation, conv.groups * count)
        return _Act(out, "channels")

    return step


def _im2col_conv(conv: nn.Conv2d, x: torch.Tensor, matrix: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A convolution of the shared input for all models: the im2col is built once, one matmul gives
    every model's output channels, and the result comes out channels-last without a copy."""
    n, _, height, width = x.shape
    kernel, stride, padding, dilation = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    assert not isinstance(padding, str), "_conv_step sends only numeric padding here"
    out_h, out_w = (
        math.floor((size + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) / stride[d] + 1)
        for d, size in enumerate((height, width))
    )
    columns = F.unfold(x, kernel, dilation, padding, stride).transpose(1, 2).reshape(n * out_h * out_w, -1)
    out = torch.addmm(bias, columns, matrix) if bias is not None else columns @ matrix
    return out.view(n, out_h, out_w, -1).permute(0, 3, 1, 2)


def _linear_step(layers: list[nn.Module]) -> Step:
    linears: list[nn.Linear] = layers  # type: ignore[assignment]
    count = len(linears)
    stacked = torch.stack([lin.weight.T for lin in linears])  # (G, F, out)
    bias = torch.stack([lin.bias for lin in linears]).unsqueeze(1) if linears[0].bias is not None else None
    shared_matrix = stacked.permute(1, 0, 2).flatten(1).contiguous()  # (F, G·out)
    shared_bias = bias.flatten() if bias is not None else None

    def step(act: _Act) -> _Act:
        x = act.data
        if act.layout == "shared" and x.ndim == 2:
            out = torch.addmm(shared_bias, x, shared_matrix) if shared_bias is not None else x @ shared_matrix
            return _Act(out.view(x.shape[0], count, -1).transpose(0, 1), "features")
        if act.layout == "features" and x.ndim == 3:
            return _Act(torch.baddbmm(bias, x, stacked) if bias is not None else torch.bmm(x, stacked), "features")
        raise _Unsupported("Linear on image activations")

    return step


def _batchnorm_step(layers: list[nn.Module]) -> Step:
    norms: list[nn.BatchNorm2d] = layers  # type: ignore[assignment]
    norm, count = norms[0], len(norms)

    def cat(name: str) -> torch.Tensor | None:
        tensors = [getattr(n, name) for n in norms]
        return None if tensors[0] is None else torch.cat(tensors)

    mean, var, weight, bias = cat("running_mean"), cat("running_var"), cat("weight"), cat("bias")
    return lambda act: _Act(
        F.batch_norm(_to_channels(act, count), mean, var, weight, bias, False, 0.0, norm.eps), "channels"
    )


def _layernorm_step(layers: list[nn.Module]) -> Step:
    """LayerNorm over each model's own (C, H, W) or (F,) values (003's CNN family), then its own affine."""
    norms: list[nn.LayerNorm] = layers  # type: ignore[assignment]
    norm, count = norms[0], len(norms)
    shape = tuple(norm.normalized_shape)
    affine = norm.weight is not None
    weight = torch.stack([n.weight for n in norms]) if affine else None  # (G, *shape)
    bias = torch.stack([n.bias for n in norms]) if affine and norm.bias is not None else None

    def step(act: _Act) -> _Act:
        x = act.data
        if act.layout == "channels" and len(shape) == 3 and x.shape[2:] == shape[1:]:
            n = x.shape[0]
            per_model = F.layer_norm(x.reshape(n, count, *shape), shape, None, None, norm.eps)
            out = _affine(per_model, weight, bias)
            return _Act(out.view(n, -1, *shape[1:]).contiguous(memory_format=torch.channels_last), "channels")
        if act.layout == "features" and len(shape) == 1:
            per_model = F.layer_norm(x, shape, None, None, norm.eps)  # (G, N, F)
            return _Act(_affine(per_model.transpose(0, 1), weight, bias).transpose(0, 1), "features")
        raise _Unsupported(f"LayerNorm{list(shape)} on {act.layout} activations")

    return step


def _affine(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """x: (N, G, *shape); weight and bias: (G, *shape)."""
    if weight is not None:
        x = x * weight
    return x + bias if bias is not None else x


def _flatten(act: _Act, count: int) -> _Act:
    """``nn.Flatten()``: (N, G·C, H, W) → (G, N, C·H·W), each model's features in (C, H, W) order."""
    x = act.data
    if act.layout == "shared":
        return _Act(x.flatten(1), "shared")
    if act.layout == "channels":
        return _Act(x.reshape(x.shape[0], count, -1).transpose(0, 1), "features")
    return act
