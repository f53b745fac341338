"""Sample-level differential privacy: DP-SGD on every optimiser step that trains on a node's own data, with Opacus
computing the per-sample gradient norms, clipping factors and noise, and accounting ε (its RDP accountant; no
accountant of our own). On with ``dp_epsilon`` or ``dp_noise``
(:class:`~dfl_node.learning.algorithm_settings.SharedSettings`); off, nothing here runs and every path trains as it did,
bit for bit.

One function, :meth:`PrivateTraining.train`, is the step of every path that touches the data — local training
(:func:`~dfl_node.learning.training.local_sgd`, FedProx's proximal term included), MKT fusion
(:func:`~dfl_node.learning.fusion.mutual_knowledge_transfer`: both models train on the receiver's data), DFML's
weighted mutual learning and FML's deep mutual learning (:mod:`dfl_node.learning.mutual`). Each step:

* **Poisson sampling**, as the accountant assumes: every sample joins the step's batch with probability
  q = min(1, B/N) (B the path's batch size, N the node's training samples *now*: data that grew gives the next
  steps its smaller q, and each step is accounted with its own), a Bernoulli mask drawn from the path's seeded
  generator. A pass is ⌈N/B⌉ such steps, as a plain pass has batches; a batch may be empty (then the step is noise).
* **Per-sample clipping**, per model: the gradient of each sample's loss is clipped to ``dp_clip`` in L2 norm over
  the model's parameters (Opacus's clipping factor ``min(1, C/(‖g_i‖ + 1e-6))``). The norms come from Opacus's
  fast-gradient-clipping hooks (ghost norms for linear layers, per-sample gradients for the rest), then a second
  backward pass of the outputs' gradients scaled by each sample's factor gives the clipped sum: Opacus's
  ``DPLossFastGradientClipping`` with the per-sample losses read off the outputs' gradients, so that every task's
  batch-mean loss serves as it is. That assumes what any per-sample gradient assumes: a sample's loss depends on
  its own outputs only (another model's outputs enter as constants: detached teachers), and the loss is the batch
  mean of the samples' losses.
* **Gaussian noise** N(0, (σ·C)²) on each parameter's clipped sum (Opacus's ``_generate_noise``), the sum then
  divided by the expected batch size q·N; then FedProx's proximal gradient μ(w − w_start), which reads no data;
  then the project's own :class:`~dfl_node.learning.training.Sgd` step.
* **Accounting**: a step that trains k models on one batch releases k Gaussian mechanisms of sensitivity C with
  noise σ·C on the same sample — one mechanism of sensitivity √k·C, so it is accounted once at noise multiplier
  σ/√k and rate q (Opacus's RDP accountant; DFML's k is the aggregator's group). Accounting k steps at σ would
  treat the k batches as drawn independently, which they are not.

The **budget**: a training call whose steps would take ε (at ``dp_delta``) past ``dp_epsilon`` takes only the steps
that keep it within (the most that do, found with the accountant), and from then on the node trains on its data no
more (it says so once, at WARNING); it keeps serving its model and taking part wherever its algorithm needs no data
(a call that takes no step changes nothing): a sender of defkt, fullavg, combo or gossip sends its model untrained;
an MKT receiver (defkt) keeps its own model and takes no fusion; fedavg, fedprox, the partial-training algorithms
and FML average as before, their members untrained (FML's meme averaging included); a DFML aggregator hands each
sender its model back as it came. Where ``dp_noise`` is not given, σ is the smallest noise multiplier (Opacus's
``get_noise_multiplier``) that keeps ``dp_epochs`` passes of local training — rate batch_size/N, ⌈N/B⌉ steps a
pass, N the node's samples when σ is first chosen — within the budget; it is chosen once and checkpointed.

The **account** (σ, every (noise multiplier, rate, steps) spent, whether the budget stopped training) is checkpointed
with the node (:meth:`PrivateTraining.state`) and restored on restart. A role that fails and is replayed spends its
steps again: the account only ever counts more than was released.

**Randomness**: the masks and the noise come from the generator each path is given — derived from (seed, round,
node), as its minibatch order was — so a run is reproducible and the simulator and the daemon agree. ``dp_secure``
is for production: each call's generator is seeded with 63 bits of the OS's CSPRNG (:mod:`secrets`), and the noise
is Opacus's ``secure_mode`` sum of draws (the fix for floating-point attacks on Gaussian samples). Opacus's own
secure mode draws from torchcsprng, which is not built for current torch; a generator seeded from the OS is what
torch offers, its stream unpredictable to whoever does not hold the seed.

Not covered: figures a node computes on its validation split (accuracy in ``/status``, defkt-select's class
profile, fairavg's weights) are not noised; ``--selection probe-samples``, which sends raw samples, is refused with
DP on (:func:`~dfl_node.learning.algorithm_settings.privacy_refusal`).
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dfl_node.errors import OperatorError
from dfl_node.learning import work
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.training import Sgd, SgdParams, autocast, batches_per_epoch, gather, release

if TYPE_CHECKING:
    from opacus.grad_sample import GradSampleHooksFastGradientClipping

log = logging.getLogger(__name__)
# The first layer's hook fires on its outputs' gradient, its input (the data) needing none: what it is meant to do
warnings.filterwarnings("ignore", "Full backward hook is firing when gradients are computed with respect to module "
                        "outputs since no inputs require gradients", UserWarning)

# What a norm sampler leaves on a parameter: a function of the batch's clipping factors giving its clipped sum
CLIPPED_SUM = "dfl_clipped_sum"
# (each model's outputs on the batch, the targets) -> the sum of the models' batch-mean losses
LossOf = Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor]
Params = list[torch.Tensor]


class PrivateTraining:
    """One node's DP-SGD: its settings, its noise multiplier and its account. ``num_samples`` (the node's training
    samples at start) sizes σ where ``dp_noise`` is not given."""

    def __init__(self, settings: SharedSettings, node_id: str, num_samples: int) -> None:
        self.node_id, self.clip, self.delta = node_id, settings.dp_clip, settings.dp_delta
        self.budget, self.secure = settings.dp_epsilon, settings.dp_secure
        self.planned = settings.dp_noise is None  # σ chosen here (and kept across restarts), not given
        if settings.dp_noise is not None:
            self.noise = settings.dp_noise
        else:
            assert settings.dp_epsilon is not None  # one of the two is given: DP is on
            rate = min(1.0, settings.batch_size / max(num_samples, 1))
            steps = math.ceil(settings.dp_epochs * batches_per_epoch(max(num_samples, 1), settings.batch_size))
            self.noise = planned_noise(settings.dp_epsilon, settings.dp_delta, rate, steps)
        self.history: list[tuple[float, float, int]] = []  # (noise multiplier, rate, steps), one per pair
        self.exhausted = False  # the budget stopped training on the data
        self.epsilon = 0.0  # spent so far, at δ

    # ----- the account ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The account as a checkpoint's JSON keeps it."""
        return {"noise": self.noise, "history": [list(h) for h in self.history], "exhausted": self.exhausted}

    def restore(self, state: dict[str, Any]) -> None:
        """The account a checkpoint kept (:meth:`state`): a restarted node goes on spending from it, at the σ it
        chose before (a σ given, ``dp_noise``, is the one given now)."""
        if self.planned:
            self.noise = float(state["noise"])
        self.history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]
        self.exhausted = bool(state["exhausted"])
        self.epsilon = epsilon_of(self.history, self.delta)

    def _record(self, noise: float, rate: float, steps: int) -> list[tuple[float, float, int]]:
        """The history with ``steps`` more at ``(noise, rate)``: one entry per pair (RDP adds up in any order)."""
        spent = dict(((s, q), n) for s, q, n in self.history)
        spent[(noise, rate)] = spent.get((noise, rate), 0) + steps
        return [(s, q, n) for (s, q), n in spent.items()]

    def _affordable(self, noise: float, rate: float, steps: int) -> int:
        """How many of ``steps`` more steps at ``(noise, rate)`` stay within the budget (all, without one). Fewer
        than all: the budget is reached, said once, and no step is taken any more."""
        if self.exhausted:
            return 0
        if self.budget is None or epsilon_of(self._record(noise, rate, steps), self.delta) <= self.budget:
            return steps
        low, high = 0, steps  # low fits, high does not: the most that fit, by bisection
        while high - low > 1:
            middle = (low + high) // 2
            if epsilon_of(self._record(noise, rate, middle), self.delta) <= self.budget:
                low = middle
            else:
                high = middle
        self.exhausted = True
        log.warning("%s: differential privacy budget reached: ε = %.3g of %.3g (δ = %g) after %d more steps; it "
                    "trains on its data no more, and goes on serving its model and fusing what needs no data",
                    self.node_id, epsilon_of(self._record(noise, rate, low), self.delta), self.budget, self.delta, low)
        return low

    # ----- the step ---------------------------------------------------------------------------
    def train(self, models: Sequence[nn.Module], optimizers: Sequence[Sgd], data: ArrayDataset, params: SgdParams,
              generator: torch.Generator, loss_of: LossOf, before_step: Callable[[], None] | None = None
              ) -> float | None:
        """``params.epochs`` passes of DP-SGD over ``data`` for ``models`` together, each stepped by its optimiser
        (released at the end); ``before_step`` adds what reads no data to the noised gradients (FedProx's term).
        The budget may cut the passes short (the steps it affords are taken, then no more) or refuse them (None:
        nothing changed); otherwise returns the mean loss of the steps' batches."""
        rate = min(1.0, params.batch_size / len(data)) if len(data) else 0.0
        steps = batches_per_epoch(len(data), params.batch_size) * params.epochs
        noise = self.noise / math.sqrt(len(models))
        planned, steps = steps, self._affordable(noise, rate, steps)
        if not steps:
            release(*optimizers)
            return None if planned else 0.0
        self.history = self._record(noise, rate, steps)  # spent before it is released: never counted short
        self.epsilon = epsilon_of(self.history, self.delta)
        work.done().steps += steps
        rng = torch.Generator().manual_seed(secrets.randbits(63)) if self.secure else generator
        hooks = [norm_hooks()(model, max_grad_norm=self.clip, use_ghost_clipping=True) for model in models]
        total = torch.zeros((), dtype=torch.float64, device=data.x.device)
        try:
            for _ in range(steps):
                batch = torch.nonzero(torch.rand(len(data), generator=rng) < rate).flatten().to(data.x.device)
                for optimizer in optimizers:
                    optimizer.zero_grad()
                if len(batch):
                    x, y = gather(data, batch)
                    total += clipped_gradients(models, hooks, x, y, loss_of, params.bf16)
                for optimizer in optimizers:
                    add_noise(optimizer.parameters, self.noise * self.clip, rate * len(data), rng, self.secure)
                if before_step is not None:
                    before_step()
                for optimizer in optimizers:
                    optimizer.step()
        finally:
            for hook in hooks:
                hook.cleanup()
            for p in (p for model in models for p in model.parameters()):
                p.__dict__.pop(CLIPPED_SUM, None)  # a step cut short leaves none behind
            release(*optimizers)
        return float(total) / steps

    @staticmethod
    def check_model(model: nn.Module, name: str) -> None:
        """An :class:`OperatorError` (one line, at start) for a model whose samples' gradients cannot be told apart:
        a layer with buffers, such as BatchNorm, mixes the samples of a batch."""
        from opacus.grad_sample import GradSampleHooks  # noqa: PLC0415 - opacus (scipy, seconds) only with DP on

        errors = GradSampleHooks.validate(model, strict=False)
        if errors:
            raise OperatorError(f"differential privacy needs each sample's gradient, which model {name} mixes across "
                                f"a batch ({str(errors[0]).strip()}); use a model without BatchNorm (e.g. cnn-ln)")


def clipped_gradients(models: Sequence[nn.Module], hooks: Sequence[GradSampleHooksFastGradientClipping],
                      x: torch.Tensor, y: torch.Tensor, loss_of: LossOf, bf16: bool = False) -> torch.Tensor:
    """Each model's ``.grad`` set to the sum over the batch of its samples' gradients, each clipped to the hooks'
    norm (:func:`clipping_factors`); returns the loss.

    One backward pass with the hooks on computes the per-sample norms. It accumulates nothing, and asks only for the
    gradient of each layer's smallest parameter (a bias, mostly): enough to pass every layer's hook, with neither
    the input's gradient (a plain pass never computes it) nor the weights' (the clipped sums replace them). The norm
    samplers of linear and convolution layers leave each of their parameters the sum of its clipped per-sample
    gradients to take once the factors are known (:data:`CLIPPED_SUM`: Opacus's ``einsum("i,i...")`` of the factors
    and the per-sample gradients, or, for a linear layer, of the factors and the ghost norm's parts), so a model of
    such layers (000's MLP and CNN) needs no second pass. The parameters of other layers (LayerNorm) get theirs from
    a second backward, hooks off, of the outputs' gradients, sample i's scaled by n·c_i, into those parameters only:
    the gradient of Σ c_i·loss_i."""
    for hook in hooks:
        hook.enable_hooks()
    with autocast(x.device, bf16):
        outputs = [model(x) for model in models]
        loss = loss_of(outputs, y)
    probes = [min(own, key=torch.Tensor.numel) for model in models for layer in model.modules()
              if (own := [p for p in layer.parameters(recurse=False) if p.requires_grad])]
    grads = torch.autograd.grad(loss, [*outputs, *probes], retain_graph=True, materialize_grads=True)[:len(outputs)]
    factors = [clipping_factors(hook) for hook in hooks]
    for hook in hooks:
        hook.disable_hooks()
    rest = []
    for model, factor in zip(models, factors, strict=True):
        for p in model.parameters():
            clipped_sum = p.__dict__.pop(CLIPPED_SUM, None)
            if clipped_sum is not None:
                p.grad = clipped_sum(factor).to(p.dtype)
            elif p.requires_grad:
                rest.append(p)
    if rest:
        n = len(x)
        scaled = [g * (n * c).to(g.dtype).view(-1, *[1] * (g.dim() - 1)) for g, c in zip(grads, factors, strict=True)]
        torch.autograd.backward(outputs, scaled, inputs=rest)
    return loss.detach()


def clipping_factors(hook: GradSampleHooksFastGradientClipping) -> torch.Tensor:
    """Opacus's per-sample clipping factors of one model, ``min(1, C/(‖g_i‖ + 1e-6))``, from the norms its hooks
    computed in the first backward pass."""
    return hook.get_clipping_coef()


def add_noise(parameters: Params, std: float, expected_batch: float, generator: torch.Generator,
              secure: bool) -> None:
    """Each parameter's gradient (the clipped sum; none: an empty batch) plus N(0, std²) noise, over the expected
    batch size: Opacus's noise, drawn on the CPU from ``generator`` (the same draws on every device)."""
    from opacus.optimizers.optimizer import _generate_noise  # noqa: PLC0415 - opacus only with DP on

    for p in (p for p in parameters if p.requires_grad):
        cpu = p if p.device.type == "cpu" else torch.empty(p.shape, dtype=p.dtype)  # the noise's shape and place
        noise = _generate_noise(std, cpu, generator, secure).to(p.device)
        p.grad = (noise if p.grad is None else p.grad.add_(noise)).div_(expected_batch)  # the step's own sum


def epsilon_of(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of the steps in ``history`` (noise multiplier, rate, steps): what Opacus's RDP accountant's
    ``get_epsilon`` computes, with the same functions in the same order, but for one thing: the RDP of a step at each
    (noise, rate) is computed once (:func:`_step_rdp`) and multiplied by the steps, as ``compute_rdp`` itself does.
    The accountant computes it afresh at every call, 60 ms a pair here: a node that asks before and after every
    update spent more time accounting an MLP's update than taking it."""
    from opacus.accountants import RDPAccountant  # noqa: PLC0415 - opacus only with DP on
    from opacus.accountants.analysis import rdp as analysis  # noqa: PLC0415

    if not history:
        return 0.0
    rdp = sum(_step_rdp(noise, rate) * steps for noise, rate, steps in history)
    epsilon, _ = analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(epsilon)


@functools.cache
def _step_rdp(noise: float, rate: float) -> Any:
    """The RDP of one step of the subsampled Gaussian mechanism at each of Opacus's default orders."""
    from opacus.accountants import RDPAccountant  # noqa: PLC0415 - opacus only with DP on
    from opacus.accountants.analysis import rdp as analysis  # noqa: PLC0415

    return analysis.compute_rdp(q=rate, noise_multiplier=noise, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)


@functools.cache
def planned_noise(epsilon: float, delta: float, rate: float, steps: int) -> float:
    """The smallest noise multiplier whose ``steps`` steps at ``rate`` spend at most ``epsilon`` (Opacus's search;
    cached: the nodes of a fleet with equal shards ask the same)."""
    from opacus.accountants.utils import get_noise_multiplier  # noqa: PLC0415 - opacus only with DP on

    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=rate, steps=steps,
                                      accountant="rdp"))


def _per_sample(grads: dict[torch.Tensor, torch.Tensor]) -> dict[torch.Tensor, torch.Tensor]:
    """The norms of the per-sample gradients ``grads`` (parameter → (n, *shape)), each parameter left its clipped
    sum: DPOptimizer's ``einsum("i,i...", factors, grad_sample)``."""
    for p, g in grads.items():
        setattr(p, CLIPPED_SUM, lambda factors, g=g: torch.einsum("i,i...", factors.to(g.dtype), g))
    return {p: torch.linalg.vector_norm(g.flatten(1), dim=1) for p, g in grads.items()}


def _linear_norms(layer: nn.Linear, activations: list[torch.Tensor],
                  backprops: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
    """Opacus's ghost norms of a linear layer's per-sample gradients, ‖g_i‖·‖a_i‖ for one row per sample, as vector
    norms (Opacus's einsum of the same took 20 times as long on a CPU: a step of the MNIST MLP 3.4× a plain one);
    the clipped sums are (c·g)ᵀa and Σ c·g."""
    from opacus.grad_sample.linear import compute_linear_norm_sample  # noqa: PLC0415 - opacus only with DP on

    if backprops.dim() != 2:  # sequences: Opacus's own, and the second backward pass
        return compute_linear_norm_sample(layer, activations, backprops)
    inputs = activations[0].to(backprops.dtype)
    out = torch.linalg.vector_norm(backprops, dim=1)
    norms = {}
    if layer.weight.requires_grad:
        norms[layer.weight] = out * torch.linalg.vector_norm(inputs, dim=1)
        setattr(layer.weight, CLIPPED_SUM, lambda factors: (backprops * factors.to(backprops.dtype)[:, None]).t()
                @ inputs)
    if layer.bias is not None and layer.bias.requires_grad:
        norms[layer.bias] = out
        setattr(layer.bias, CLIPPED_SUM, lambda factors: factors.to(backprops.dtype) @ backprops)
    return norms


def _conv_norms(layer: nn.Conv1d | nn.Conv2d | nn.Conv3d, activations: list[torch.Tensor],
                backprops: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
    """The norms of a convolution's per-sample gradients, each the weight gradient of one sample, computed by
    ``convolution_backward`` under ``vmap`` (Opacus's unfold and einsum of the same made a CNN's step 2.6× a plain
    one); a padding Opacus handles itself (a mode other than zeros, ``same``) by its grad sampler."""
    from opacus.grad_sample.conv import compute_conv_grad_sample  # noqa: PLC0415 - opacus only with DP on

    if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
        return _per_sample(compute_conv_grad_sample(layer, activations, backprops))
    weight = layer.weight

    def one(sample: torch.Tensor, backprop: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution_backward(
            backprop[None], sample[None], weight, None, layer.stride, layer.padding, layer.dilation, False,
            [0] * len(layer.stride), layer.groups, [False, True, False])[1]

    grads = {}
    if weight.requires_grad:
        grads[weight] = torch.func.vmap(one)(activations[0].to(backprops.dtype), backprops)
    if layer.bias is not None and layer.bias.requires_grad:
        grads[layer.bias] = backprops.flatten(2).sum(2)
    return _per_sample(grads)


@functools.cache
def norm_hooks() -> type[GradSampleHooksFastGradientClipping]:
    """Opacus's fast-gradient-clipping hooks (attached to a model, not wrapping it), with the norms of linear and
    convolution layers computed as above; built on first use, so that opacus is imported only with DP on."""
    from opacus.grad_sample import GradSampleHooksFastGradientClipping  # noqa: PLC0415 - opacus only with DP on

    samplers = {**GradSampleHooksFastGradientClipping.NORM_SAMPLERS, nn.Linear: _linear_norms,
                nn.Conv1d: _conv_norms, nn.Conv2d: _conv_norms, nn.Conv3d: _conv_norms}
    return type("NormHooks", (GradSampleHooksFastGradientClipping,), {"NORM_SAMPLERS": samplers})

