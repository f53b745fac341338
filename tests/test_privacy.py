"""Differential privacy: DP-SGD through Opacus on every step that trains on a node's data, for each
algorithm family — knowledge transfer (defkt's MKT), averaging (fullavg, fedprox's local training), mutual learning
(dfml, fml) — the ε its account reports, the budget that stops training, the account across a restart, and what is
refused with DP on."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from opacus.accountants import RDPAccountant
from prometheus_client import generate_latest
from torch import nn

from dfl_node.algorithms import Group, NodeContext, Step, make_algorithm
from dfl_node.algorithms.base import equip
from dfl_node.cli import cli
from dfl_node.errors import OperatorError
from dfl_node.learning import privacy
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import mkt_losses
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.mutual import dfml_losses, fml_losses
from dfl_node.learning.privacy import PrivateTraining, clipped_gradients, norm_hooks
from dfl_node.learning.training import Sgd
from dfl_node.node.views import node_status
from dfl_node.records.metrics import NodeMetrics
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.sim import run_fleet
from tests.helpers.fleet import FLEET, daemon

SAMPLES, BATCH = 24, 8
DP = dict(batch_size=BATCH, mkt_batch_size=BATCH, lr=0.1, momentum=0.5, dp_noise=1.0, dp_clip=0.01)
OPTIONS = AlgorithmOptions(dfml_epochs=2, meme_model="mlp:8", prox_mu=0.1)
SPEC = "mlp:16"


def _context(node_id: str, seed: int, algorithm: str, **settings: object) -> NodeContext:
    config = SharedSettings(**{**DP, **settings})
    g = torch.Generator().manual_seed(seed)
    data = ArrayDataset(torch.randn(SAMPLES + 4, 1, 8, 8, generator=g), torch.randint(0, 4, (SAMPLES + 4,),
                                                                                       generator=g), 10)
    spec = ModelSpec.parse(SPEC)
    ctx = NodeContext(node_id, spec.build((1, 8, 8), 10, seed=0), spec, data.subset(range(SAMPLES)),
                      data.subset(range(SAMPLES, SAMPLES + 4)), config)
    equip(make_algorithm(algorithm, config, OPTIONS), ctx, seed=0)
    if config.private:
        ctx.privacy = PrivateTraining(config, node_id, SAMPLES)
    return ctx


def _play(algorithm: str, aggregator: NodeContext, senders: list[NodeContext]) -> None:
    """One round of ``algorithm``'s roles among the contexts, as the runner plays them."""
    algo = make_algorithm(algorithm, aggregator.config, OPTIONS)
    step = Step(0, Group(aggregator.node_id, tuple(s.node_id for s in senders)), {"dfml.alpha": "0.5",
                                                                                    "dfml.peak_alpha": "0.9"})
    algo.local_step(aggregator, step)
    messages = [algo.transmit(s, step) for s in senders]
    replies = algo.aggregate(aggregator, step, sorted(messages, key=lambda m: m.sender))
    for s in senders:
        algo.finish(s, step, replies.get(s.node_id))


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int, torch.Tensor | None]]]:
    """Every optimiser step, clipping and noising, in order: ("clip", 0, factors), ("noise", id(params), None),
    ("step", id(params), None)."""
    events: list[tuple[str, int, torch.Tensor | None]] = []
    clip, noise, step = privacy.clipping_factors, privacy.add_noise, Sgd.step

    def clipping(hook):  # type: ignore[no-untyped-def]
        factors = clip(hook)
        events.append(("clip", 0, factors.detach().clone()))
        return factors

    def noising(parameters, *args):  # type: ignore[no-untyped-def]
        events.append(("noise", id(parameters), None))
        noise(parameters, *args)

    def stepping(self: Sgd) -> None:
        events.append(("step", id(self.parameters), None))
        step(self)

    monkeypatch.setattr(privacy, "clipping_factors", clipping)
    monkeypatch.setattr(privacy, "add_noise", noising)
    monkeypatch.setattr(Sgd, "step", stepping)
    yield events


# per family: the algorithm, its senders, and each node's training calls on its own data: (models trained together,
# passes)
FAMILIES = {
    "defkt": ("defkt", 1, [[(2, 1)], [(1, 1)]]),  # the receiver's MKT trains 2 models, the sender its copy
    "fullavg": ("fullavg", 1, [[], [(1, 1)]]),  # the sender trains; averaging reads no data
    "fedprox": ("fedprox", 1, [[(1, 1)], [(1, 1)]]),  # aggregator and sender train, with the proximal term
    "dfml": ("dfml", 2, [[(1, 1), (3, 2)], [(1, 1)], [(1, 1)]]),  # all train; then 2 passes of mutual learning of 3
    "fml": ("fml", 1, [[(2, 1)], [(2, 1)]]),  # local and meme model learn from each other on every participant
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_step_on_a_nodes_data_clips_each_sample_and_adds_noise(family: str, steps: list) -> None:
    algorithm, senders, calls = FAMILIES[family]
    nodes = [_context(f"n{i}", i, algorithm) for i in range(senders + 1)]
    before = [[p.detach().clone() for p in n.model.parameters()] for n in nodes]
    _play(algorithm, nodes[0], nodes[1:])
    per_pass = math.ceil(SAMPLES / BATCH)
    stepped = [e for e in steps if e[0] == "step"]
    # every step of every model on the data went through DP-SGD, and nothing else stepped
    assert len(stepped) == sum(k * passes * per_pass for node in calls for k, passes in node)
    noised: set[int] = set()
    for kind, params, factors in steps:
        if kind == "noise":
            noised.add(params)
        elif kind == "step":
            assert params in noised  # noised since its last step
            noised.discard(params)
        else:  # with a clip of 0.01 every sample's gradient is clipped
            assert factors is not None and len(factors) and bool((factors < 1).all())
    clipped = [e for e in steps if e[0] == "clip"]
    assert 0 < len(clipped) <= len(stepped)  # once per model and step, but for a Poisson batch that came out empty
    for node, expected in zip(nodes, calls):  # the account: each call at σ/√k, rate B/N, its steps
        assert node.privacy is not None
        assert sorted(node.privacy.history) == sorted((1.0 / math.sqrt(k), BATCH / SAMPLES, passes * per_pass)
                                                      for k, passes in expected)
    assert any(not torch.equal(a, b) for node, old in zip(nodes, before)
               for a, b in zip(node.model.parameters(), old))


def _brute_force(models: list[nn.Module], x: torch.Tensor, y: torch.Tensor, loss_of, clip: float  # type: ignore[no-untyped-def]
                 ) -> list[list[torch.Tensor]]:
    """Each model's clipped sum, one sample at a time: the definition the DP step must meet."""
    sums = [[torch.zeros_like(p) for p in m.parameters()] for m in models]
    for i in range(len(x)):
        for m in models:
            m.zero_grad()
        loss_of([m(x[i:i + 1]) for m in models], y[i:i + 1]).backward()
        for total, m in zip(sums, models):
            grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
            factor = min(1.0, clip / (float(torch.sqrt(sum((g ** 2).sum() for g in grads))) + 1e-6))
            for t, g in zip(total, grads):
                t += factor * g
    return sums


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, stride=2), nn.ReLU(), nn.Conv2d(4, 6, 3, groups=2, padding=1),
                         nn.LayerNorm([6, 4, 4]), nn.Flatten(), nn.Linear(96, 10))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


LOSSES = {
    "local-mlp": (lambda: [_mlp()], lambda o, y: F.cross_entropy(o[0], y)),
    "local-cnn": (lambda: [_cnn()], lambda o, y: F.cross_entropy(o[0], y)),
    "conv1d": (lambda: [nn.Sequential(nn.Flatten(1, 2), nn.Conv1d(8, 5, 3, padding=1), nn.Flatten(),
                                      nn.Linear(40, 10))], lambda o, y: F.cross_entropy(o[0], y)),
    "mkt": (lambda: [_cnn(), _mlp()], lambda o, y: torch.stack(mkt_losses(o[0], o[1], y)).sum()),
    "dfml": (lambda: [_cnn(), _mlp(), _mlp()],
             lambda o, y: torch.stack(dfml_losses(o, y, 0.5, [1, 2, 3], F.cross_entropy)).sum()),
    "fml": (lambda: [_mlp(), _cnn()], lambda o, y: torch.stack(fml_losses(o[0], o[1], y, 0.3, 0.6)).sum()),
}


@pytest.mark.parametrize("case", sorted(LOSSES))
@pytest.mark.parametrize("clip", [1e-3, 0.5, 100.0])
def test_the_clipped_sum_is_each_samples_gradient_clipped_then_summed(case: str, clip: float) -> None:
    torch.manual_seed(0)
    build, loss_of = LOSSES[case]
    models = build()
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 10, (12,))
    expected = _brute_force(models, x, y, loss_of, clip)
    hooks = [norm_hooks()(m, max_grad_norm=clip, use_ghost_clipping=True) for m in models]
    for m in models:
        m.zero_grad()
    clipped_gradients(models, hooks, x, y, loss_of)
    for hook in hooks:
        hook.cleanup()
    for m, sums in zip(models, expected):
        for p, want in zip(m.parameters(), sums):
            assert p.grad is not None
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-6 * clip)


def test_epsilon_is_what_opacus_accountant_gives_for_the_steps_spent() -> None:
    ctx = _context("a", 0, "defkt", dp_epsilon=1e6)
    sender = _context("b", 1, "defkt", dp_epsilon=1e6)
    _play("defkt", ctx, [sender])  # the receiver's MKT: 2 models a step
    ctx.trained_copy(1)  # then local training: 1 model
    assert ctx.privacy is not None
    per_call = math.ceil(SAMPLES / BATCH)
    assert sorted(ctx.privacy.history) == sorted([(1 / math.sqrt(2), BATCH / SAMPLES, per_call),
                                                  (1.0, BATCH / SAMPLES, per_call)])
    fresh = RDPAccountant()
    for noise, steps in ((1 / math.sqrt(2), per_call), (1.0, per_call)):
        for _ in range(steps):
            fresh.step(noise_multiplier=noise, sample_rate=BATCH / SAMPLES)
    assert ctx.privacy.epsilon == pytest.approx(fresh.get_epsilon(1e-5), rel=1e-9)
    before = ctx.privacy.epsilon
    ctx.trained_copy(2)
    assert ctx.privacy.epsilon > before


def test_growing_data_is_accounted_at_its_new_rate() -> None:
    ctx = _context("a", 0, "fullavg")
    ctx.trained_copy(0)
    g = torch.Generator().manual_seed(5)
    more = ArrayDataset(torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 4, (40,), generator=g), 10)
    ctx.use_data(more, ctx.val)
    ctx.trained_copy(1)
    assert ctx.privacy is not None
    assert sorted(ctx.privacy.history) == [(1.0, BATCH / 40, math.ceil(40 / BATCH)),
                                           (1.0, BATCH / SAMPLES, math.ceil(SAMPLES / BATCH))]


def test_a_node_that_reaches_its_budget_stops_training_on_its_data(caplog: pytest.LogCaptureFixture) -> None:
    per_call = math.ceil(SAMPLES / BATCH)
    one, two = (privacy.epsilon_of([(1.0, BATCH / SAMPLES, n * per_call)], 1e-5) for n in (1, 2))
    budget = (one + two) / 2  # room for one local update and part of another
    receiver, sender = _context("a", 0, "defkt", dp_epsilon=budget), _context("b", 1, "defkt", dp_epsilon=budget)
    assert receiver.privacy is not None
    receiver.trained_copy(0)
    assert not receiver.privacy.exhausted and receiver.privacy.epsilon == pytest.approx(one)
    own = [p.detach().clone() for p in receiver.model.parameters()]
    with caplog.at_level(logging.WARNING, logger="dfl_node.learning.privacy"):
        receiver.trained_copy(1)  # cut short: the steps the budget affords
        steps = sum(n for *_, n in receiver.privacy.history)
        assert receiver.privacy.exhausted and per_call <= steps < 2 * per_call
        spent = receiver.privacy.epsilon
        assert spent <= budget
        trained = receiver.trained_copy(2)  # then none: the copy is the model as it was
        assert all(torch.equal(a, b) for a, b in zip(trained.parameters(), own))
        _play("defkt", receiver, [sender])  # the MKT receiver keeps its own model: no fusion
        _play("defkt", receiver, [sender])
    assert all(torch.equal(a, b) for a, b in zip(receiver.model.parameters(), own))
    assert receiver.privacy.epsilon == spent and sum(n for *_, n in receiver.privacy.history) == steps
    warnings = [r for r in caplog.records if r.getMessage().startswith("a: differential privacy budget reached")]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING  # said once


@pytest.mark.asyncio
async def test_a_restarted_node_continues_its_account(fleet_shards: Path, tmp_path: Path) -> None:
    settings = dict(id="node-0", data=fleet_shards / "node-0", http_port=0, mdns=False, state_dir=tmp_path / "state",
                    evaluate=False, dp_epsilon=50.0)
    node = daemon(**settings).node
    ctx = node.learner.ctx
    assert ctx.privacy is not None
    noise = ctx.privacy.noise
    ctx.trained_copy(0)
    spent, history = ctx.privacy.epsilon, list(ctx.privacy.history)
    assert spent > 0
    await node.save()
    node.learner.checkpoint.lock.release()
    again = daemon(**settings).node
    restored = again.learner.ctx.privacy
    assert restored is not None
    assert (restored.noise, restored.history, restored.epsilon) == (noise, history, spent)
    again.learner.ctx.trained_copy(1)
    assert restored.epsilon > spent  # spending goes on from the account, not from zero
    # shown where accuracy is: /status, /metrics
    status = node_status(again)
    assert status.privacy is not None and status.privacy.epsilon == restored.epsilon
    assert (status.privacy.budget, status.privacy.exhausted) == (50.0, False)
    metrics = generate_latest(NodeMetrics("node-0", lambda: status).registry).decode()
    assert f'dfl_privacy_epsilon{{node="node-0"}} {restored.epsilon!r}' in metrics
    again.learner.checkpoint.lock.release()


def test_a_runs_results_carry_each_nodes_epsilon() -> None:
    private = run_fleet(ExperimentConfig(nodes=2, rounds=2, eval_every=2, hidden=[8], dp_noise=2.0), "fedavg")
    assert all(n.epsilon is not None and n.epsilon > 0 for n in private.nodes)
    plain = run_fleet(ExperimentConfig(nodes=2, rounds=1, eval_every=1, hidden=[8]), "fedavg")
    assert all(n.epsilon is None for n in plain.nodes)


def test_dp_noise_is_seeded_unless_secure() -> None:
    def trained(**settings: object) -> list[torch.Tensor]:
        ctx = _context("a", 0, "fullavg", **settings)
        return [p.detach().clone() for p in ctx.trained_copy(0).parameters()]

    assert all(torch.equal(a, b) for a, b in zip(trained(), trained()))  # reproducible from the seed
    assert not all(torch.equal(a, b) for a, b in zip(trained(dp_secure=True), trained(dp_secure=True)))


def test_sigma_is_chosen_for_the_planned_passes() -> None:
    ctx = _context("a", 0, "fullavg", dp_noise=None, dp_epsilon=2.0, dp_epochs=4)
    assert ctx.privacy is not None
    planned = math.ceil(4 * math.ceil(SAMPLES / BATCH))
    accountant = RDPAccountant()
    accountant.history = [(ctx.privacy.noise, BATCH / SAMPLES, planned)]
    assert 1.9 < accountant.get_epsilon(1e-5) <= 2.0


def test_probe_samples_is_refused_with_dp_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--algorithm", "defkt-select", "--selection", "probe-samples",
                                      "--dp-epsilon", "1", "--out", str(tmp_path), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "--selection probe-samples sends raw samples" in result.output
    with pytest.raises(ValueError, match="probe-samples sends raw samples"):
        NodeConfig.for_experiment(FLEET, id="n", data=tmp_path, algorithm="defkt-select", selection="probe-samples",
                                  dp_noise=1.0)


def test_dp_settings_without_dp_are_refused() -> None:
    with pytest.raises(ValueError, match="--dp-clip need differential privacy on"):
        SharedSettings(dp_clip=2.0)


def test_a_model_that_mixes_samples_is_refused_at_start() -> None:
    with pytest.raises(OperatorError, match="BatchNorm"):
        PrivateTraining.check_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "bn")


def test_with_dp_off_nothing_of_it_runs(tmp_path: Path) -> None:
    """Off, no node has a privacy account and opacus is never imported: every path trains as before (the suite's
    bit-for-bit tests of the plain loop, tests/test_inner_loop.py, and of the simulator hold it to its bits)."""
    code = ("import sys\nfrom dfl_node.settings.experiment import ExperimentConfig\n"
            "from dfl_node.sim import run_fleet\n"
            "run_fleet(ExperimentConfig(nodes=2, rounds=1, eval_every=1, hidden=[8]), 'defkt')\n"
            "assert 'opacus' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_dfl_node_status_shows_epsilon_beside_the_figures() -> None:
    from rich.console import Console  # noqa: PLC0415

    from dfl_node.api.status_tables import fleet_table, node_table  # noqa: PLC0415

    spent = {"epsilon": 1.234, "delta": 1e-5, "budget": 3.0, "noise_multiplier": 1.1, "clip": 1.0, "exhausted": True}
    private = {"id": "a", "round": 3, "role": "idle", "local_accuracy": 0.5, "global_accuracy": 0.4, "privacy": spent}
    plain = {"id": "b", "round": 3, "role": "idle", "local_accuracy": 0.5, "global_accuracy": 0.4}

    def shown(table: object) -> str:
        console = Console(width=200, record=True)
        console.print(table)
        return console.export_text()

    node = shown(node_table(private, "http://127.0.0.1:8080"))
    assert "ε 1.23 of 3 at δ 1e-05, σ 1.1, clip 1 stopped" in node
    fleet = shown(fleet_table([{"status": private, "url": "u"}, {"status": plain, "url": "v"}]))
    assert "ε" in fleet.splitlines()[1] + fleet.splitlines()[2] and "ε 1.23 of 3 stopped" in fleet
    assert "ε" not in shown(fleet_table([{"status": plain, "url": "v"}]))  # no column without DP
    assert "privacy" not in shown(node_table(plain, "http://127.0.0.1:8080"))
