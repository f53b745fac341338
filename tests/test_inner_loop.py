"""The simulator's inner loop does only forward, backward and step, and computes exactly
what the plain loop computes: a gather per batch, a fresh optimiser per update, a deep copy per
trained model. Each test runs the plain loop written out here beside the project's and wants the
same bits."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.algorithms import NodeContext
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import mkt_losses, mutual_knowledge_transfer
from dfl_node.learning.models import ModelSpec, build_model
from dfl_node.learning.training import SgdParams, local_sgd, minibatches, release, sgd
from dfl_node.settings.experiment import ExperimentConfig

ROOT = Path(__file__).resolve().parents[1]
PARAMS = SgdParams(lr=0.05, momentum=0.5, batch_size=16, epochs=2)


def data(seed: int = 0, n: int = 90) -> ArrayDataset:
    g = torch.Generator().manual_seed(seed)
    return ArrayDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g), 10)


def model(seed: int = 0) -> nn.Module:
    return build_model("mlp", (1, 8, 8), 10, hidden=[32, 16], seed=seed)


def plain_local_sgd(model: nn.Module, data: ArrayDataset, params: SgdParams, generator: torch.Generator) -> None:
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=params.lr, momentum=params.momentum)
    for _ in range(params.epochs):
        for idx in minibatches(len(data), params.batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
            optimizer.step()


def plain_mkt(received: nn.Module, local: nn.Module, data: ArrayDataset, params: SgdParams,
              generator: torch.Generator) -> None:
    received.train()
    local.train()
    opt1 = torch.optim.SGD(received.parameters(), lr=params.lr, momentum=params.momentum)
    opt2 = torch.optim.SGD(local.parameters(), lr=params.lr, momentum=params.momentum)
    for _ in range(params.epochs):
        for idx in minibatches(len(data), params.batch_size, generator):
            x, y = data.x[idx], data.y[idx]
            loss1, loss2 = mkt_losses(received(x), local(x), y)
            opt1.zero_grad(set_to_none=True)
            opt2.zero_grad(set_to_none=True)
            (loss1 + loss2).backward()
            opt1.step()
            opt2.step()


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_local_sgd_is_the_plain_loop_bit_for_bit_update_after_update() -> None:
    """Three updates in a row: the reused optimiser starts each without the last one's momentum."""
    ours, plain, shard = model(), model(), data()
    for round_ in range(3):
        loss = local_sgd(ours, shard, PARAMS, torch.Generator().manual_seed(round_))
        plain_local_sgd(plain, shard, PARAMS, torch.Generator().manual_seed(round_))
        assert same(ours, plain), round_
        assert loss > 0


def test_mkt_is_the_plain_loop_bit_for_bit_update_after_update() -> None:
    ours, plain = (model(1), model(2)), (model(1), model(2))
    shard = data(3)
    for round_ in range(3):
        mutual_knowledge_transfer(*ours, shard, PARAMS, PARAMS, torch.Generator().manual_seed(round_))
        plain_mkt(*plain, shard, PARAMS, torch.Generator().manual_seed(round_))
        assert same(ours[0], plain[0]) and same(ours[1], plain[1]), round_


def test_an_update_frees_its_gradients_and_momentum() -> None:
    net = model()
    optimizer = sgd(net, PARAMS)
    F.cross_entropy(net(data().x), data().y).backward()
    optimizer.step()
    assert optimizer.buffers is not None and all(p.grad is not None for p in net.parameters())
    release(optimizer)
    # freed when the update ends, not kept until the next one
    assert optimizer.buffers is None and all(p.grad is None for p in net.parameters())


def test_without_momentum_too_the_steps_are_torchs() -> None:
    still = SgdParams(lr=0.2, momentum=0.0, batch_size=8, epochs=2)
    ours, plain = model(4), model(4)
    local_sgd(ours, data(5), still, torch.Generator().manual_seed(0))
    plain_local_sgd(plain, data(5), still, torch.Generator().manual_seed(0))
    assert same(ours, plain) and not same(ours, model(4))


def test_training_loads_no_compiler() -> None:
    """``torch.optim``'s first optimiser imports ``torch._dynamo`` (1 s, 73 MB): a fresh process that trains
    and fuses with ours does not."""
    script = ("import sys, torch\n"
              "from tests.test_inner_loop import PARAMS, data, model\n"
              "from dfl_node.learning.training import local_sgd\n"
              "from dfl_node.learning.fusion import mutual_knowledge_transfer\n"
              "local_sgd(model(), data(), PARAMS, torch.Generator().manual_seed(0))\n"
              "mutual_knowledge_transfer(model(1), model(2), data(), PARAMS, PARAMS, torch.Generator())\n"
              "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_trained_copy_reuses_one_spare_and_leaves_the_model_alone() -> None:
    config = ExperimentConfig(lr=0.05, batch_size=16)
    ctx = NodeContext("node-0", model(), ModelSpec("mlp", (32, 16)), data(), data(1, 20), config.learning)
    before = copy.deepcopy(ctx.model)
    first = ctx.trained_copy(0)
    plain = copy.deepcopy(before)
    plain_local_sgd(plain, ctx.train, ctx.local_params(), ctx.local_generator(0))
    assert same(first, plain) and same(ctx.model, before)
    second = ctx.trained_copy(1)  # trained from the node's model again, not from the last copy
    plain = copy.deepcopy(before)
    plain_local_sgd(plain, ctx.train, ctx.local_params(), ctx.local_generator(1))
    assert second is first and same(second, plain)
    assert ctx.spare("received") is not first
