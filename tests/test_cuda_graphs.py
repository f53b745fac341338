"""The CUDA-graph fast path on the CPU: :mod:`dfl_node.learning.cuda_graphs` with its eager stand-in for a CUDA
graph (:class:`EagerRecorder`), so that all of it but the capture itself — the static row order, the zeroed
momentum buffers, the loss sum, the warm-up that puts the models back, the cache, the fall-back — runs here and
must give the eager loop's bits. The epoch bodies (``local_epoch``, ``mkt_epoch``) are what a CUDA graph captures.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dfl_node.learning import cuda_graphs, fusion, work
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import mutual_knowledge_transfer
from dfl_node.learning.models import build_model
from dfl_node.learning.training import SgdParams, evaluate, graphed_local_sgd, local_sgd

PARAMS = SgdParams(lr=0.05, momentum=0.5, batch_size=16, epochs=2)
SPECS = {"mlp": [32, 16], "cnn": [4, 8, 16]}


def data(seed: int = 0, n: int = 90) -> ArrayDataset:
    g = torch.Generator().manual_seed(seed)
    return ArrayDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g), 10)


def model(name: str, seed: int = 0) -> nn.Module:
    return build_model(name, (1, 8, 8), 10, hidden=SPECS[name], seed=seed)


def values(*models: nn.Module) -> list[torch.Tensor]:
    return [t for m in models for t in m.state_dict().values()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    cuda_graphs.clear()


def graphed_local(net: nn.Module, shard: ArrayDataset, params: SgdParams, g: torch.Generator) -> float | None:
    return graphed_local_sgd(net, shard, params, g, recorder=cuda_graphs.EagerRecorder)


def graphed_mkt(a: nn.Module, b: nn.Module, shard: ArrayDataset, params: SgdParams, g: torch.Generator) -> None:
    assert fusion.graphed_mkt(a, b, shard, params, params, g, recorder=cuda_graphs.EagerRecorder)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("params", [PARAMS, SgdParams(lr=0.2, momentum=0.0, batch_size=8, epochs=3),
                                    SgdParams(lr=0.05, momentum=0.5, batch_size=90, epochs=1)])
def test_graphed_local_sgd_is_local_sgd_bit_for_bit_update_after_update(name: str, params: SgdParams) -> None:
    """Three updates of one model in a row (one graph, replayed): the models and the mean losses are the eager
    loop's, momentum or none, a last batch that is smaller or one batch an epoch."""
    eager, fast, shard = model(name), model(name), data()
    for round_ in range(3):
        loss = local_sgd(eager, shard, params, torch.Generator().manual_seed(round_))
        assert graphed_local(fast, shard, params, torch.Generator().manual_seed(round_)) == loss
        assert same(values(eager), values(fast)), round_
    assert len(cuda_graphs._CACHE) == 1  # recorded once, replayed for every update after


@pytest.mark.parametrize("name", sorted(SPECS))
def test_graphed_mkt_is_mkt_bit_for_bit_update_after_update(name: str) -> None:
    eager, fast, shard = (model(name, 1), model(name, 2)), (model(name, 1), model(name, 2)), data(3)
    for round_ in range(3):
        mutual_knowledge_transfer(*eager, shard, PARAMS, PARAMS, torch.Generator().manual_seed(round_))
        graphed_mkt(*fast, shard, PARAMS, torch.Generator().manual_seed(round_))
        assert same(values(*eager), values(*fast)), round_


def test_bf16_autocast_is_the_same_in_the_graph_body() -> None:
    """``precision: bf16`` runs the forward passes under autocast, in the eager loop and in the captured body alike."""
    bf16 = SgdParams(lr=0.05, momentum=0.5, batch_size=16, epochs=1, bf16=True)
    eager, fast, shard = model("cnn"), model("cnn"), data()
    local_sgd(eager, shard, bf16, torch.Generator().manual_seed(0))
    graphed_local(fast, shard, bf16, torch.Generator().manual_seed(0))
    assert same(values(eager), values(fast))
    plain = model("cnn")
    local_sgd(plain, shard, PARAMS, torch.Generator().manual_seed(0))
    assert not same(values(plain), values(eager))  # it did change the arithmetic


def test_a_model_written_in_place_keeps_its_graph_which_trains_from_the_new_values() -> None:
    """Fusions and restores write models in place (``load_state_dict``): the graph recorded for the model's tensors
    is the one replayed, and it starts from whatever they hold now."""
    fast, shard = model("mlp"), data()
    graphed_local(fast, shard, PARAMS, torch.Generator().manual_seed(0))
    [graph] = cuda_graphs._CACHE.values()
    fast.load_state_dict(model("mlp", seed=7).state_dict())
    eager = model("mlp", seed=7)
    local_sgd(eager, shard, PARAMS, torch.Generator().manual_seed(1))
    graphed_local(fast, shard, PARAMS, torch.Generator().manual_seed(1))
    assert same(values(eager), values(fast))
    assert list(cuda_graphs._CACHE.values()) == [graph]


class Forgetful:
    """Records as a CUDA graph does, holding nothing of the models (the eager stand-in's epoch holds them)."""

    def record(self, warm_up: Callable[[], None], epoch: Callable[[], None]) -> None:
        warm_up()

    def replay(self) -> None:
        pass


def test_graphs_are_kept_per_model_data_and_settings_and_go_with_their_models() -> None:
    shard, other = data(), data(1, 60)
    a, b = model("mlp"), model("mlp")
    g = torch.Generator()

    def train(net: nn.Module, shard: ArrayDataset, params: SgdParams) -> None:
        graphed_local_sgd(net, shard, params, g, recorder=Forgetful)

    train(a, shard, PARAMS)
    train(b, shard, PARAMS)
    train(a, other, PARAMS)
    train(a, shard, SgdParams(lr=0.1, momentum=0.5, batch_size=16, epochs=2))
    train(a, shard, SgdParams(lr=0.05, momentum=0.5, batch_size=16, epochs=5))  # epochs: the same graph
    assert len(cuda_graphs._CACHE) == 4
    del b
    gc.collect()
    assert len(cuda_graphs._CACHE) == 3  # b's graph went with b
    del other
    gc.collect()
    assert len(cuda_graphs._CACHE) == 2  # and a's on the other shard with the shard
    del a
    gc.collect()
    assert len(cuda_graphs._CACHE) == 0


def test_work_is_counted_as_the_eager_loop_counts_it() -> None:
    """The simulator charges virtual time by these counters: the fast path must charge the same steps."""
    shard = data()
    for train in (lambda net, g: local_sgd(net, shard, PARAMS, g), lambda net, g: graphed_local(net, shard, PARAMS, g)):
        before = work.done().copy()
        train(model("mlp"), torch.Generator())
        assert work.done().since(before).steps == 2 * 6  # 2 epochs of ceil(90 / 16) batches


class Frozen(nn.Module):
    """A model one of whose trainable parameters gets no gradient: its momentum buffers cannot be static."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(64, 10), nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x.flatten(1))


def test_a_model_the_graph_cannot_hold_is_left_as_it_was_and_not_tried_again() -> None:
    """Where a trainable parameter gets no gradient the graphed trainer declines (local_sgd then runs its eager
    loop), its warm-up undone and nothing drawn from the generator."""
    shard, net = data(), Frozen()
    before = [t.clone() for t in values(net)]
    g = torch.Generator().manual_seed(0)
    assert graphed_local(net, shard, PARAMS, g) is None
    assert same(values(net), before) and torch.equal(g.get_state(), torch.Generator().manual_seed(0).get_state())
    assert graphed_local(net, shard, PARAMS, g) is None
    assert list(cuda_graphs._CACHE.values()) == [None]  # remembered: not tried again


class Refused:
    """A capture CUDA refuses (what ``capture_end`` raises where a body did something a graph cannot hold)."""

    def record(self, warm_up: Callable[[], None], epoch: Callable[[], None]) -> None:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore detail")

    def replay(self) -> None:
        raise AssertionError("never recorded")


def test_a_capture_cuda_refuses_is_a_warning_and_the_models_train_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    shard, net = data(), model("mlp")
    before = dict(cuda_graphs.COUNTS)
    with caplog.at_level("WARNING", logger="dfl_node.learning.cuda_graphs"):
        assert graphed_local_sgd(net, shard, PARAMS, torch.Generator(), recorder=Refused) is None
    assert [r.getMessage() for r in caplog.records] == [
        "a CUDA graph could not be recorded, training eagerly instead: CUDA error: operation not permitted when "
        "stream is capturing"]
    assert {"recorded": before["recorded"], "declined": before["declined"] + 1} == cuda_graphs.COUNTS
    graphed_local(model("mlp"), shard, PARAMS, torch.Generator())
    assert cuda_graphs.COUNTS["recorded"] == before["recorded"] + 1


def test_on_the_cpu_the_setting_changes_nothing() -> None:
    """``cuda_graphs`` applies to data on CUDA only: on the CPU local_sgd and MKT run their eager loops."""
    on = SgdParams(lr=0.05, momentum=0.5, batch_size=16, epochs=2, cuda_graphs=True)
    shard = data()
    a, b = (model("mlp"), model("mlp", 1)), (model("mlp"), model("mlp", 1))
    local_sgd(a[0], shard, on, torch.Generator().manual_seed(0))
    local_sgd(b[0], shard, PARAMS, torch.Generator().manual_seed(0))
    mutual_knowledge_transfer(*a, shard, on, on, torch.Generator().manual_seed(1))
    mutual_knowledge_transfer(*b, shard, PARAMS, PARAMS, torch.Generator().manual_seed(1))
    assert same(values(*a), values(*b)) and not cuda_graphs._CACHE


def test_evaluation_reads_its_sums_once_and_gives_the_per_batch_figures() -> None:
    """Sums kept on the device in float64 are the Python floats a read per batch added up, bit for bit."""
    net, shard = model("cnn"), data(4, 300)
    net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(shard), 128):
            logits = net(shard.x[start:start + 128])
            loss += float(F.cross_entropy(logits, shard.y[start:start + 128], reduction="sum"))
            correct += int((logits.argmax(1) == shard.y[start:start + 128]).sum())
    result = evaluate(net, shard, batch_size=128)
    assert (result.score, result.loss) == (correct / 300, loss / 300)


def test_work_counters_and_model_builds_are_per_thread() -> None:
    """What lets runs share a process (``--streams``): each thread counts only its own work, and models built at
    the same time in several threads get each its own seed's ``w0`` (they share torch's CPU generator)."""
    alone = {seed: values(build_model("cnn", (1, 8, 8), 10, hidden=[4, 8, 16], seed=seed)) for seed in range(8)}
    built: dict[int, list[torch.Tensor]] = {}
    counted: dict[int, int] = {}
    start = threading.Barrier(8)

    def run(seed: int) -> None:
        start.wait()
        for _ in range(20):
            built[seed] = values(build_model("cnn", (1, 8, 8), 10, hidden=[4, 8, 16], seed=seed))
        work.done().steps += seed
        counted[seed] = work.done().steps

    threads: list[threading.Thread] = [threading.Thread(target=run, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(same(built[seed], alone[seed]) for seed in range(8))
    assert counted == {seed: seed for seed in range(8)}


def test_a_replay_before_a_recording_is_an_error() -> None:
    with pytest.raises(AssertionError, match="replay before record"):
        cuda_graphs.EagerRecorder().replay()
