"""003's DFML and its decentralized baselines (HeteroFL, FedRolex, Federated Dropout, FML) as algorithms,
the auxiliary models they keep (peak, meme) and what the simulator reports of them."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from dfl_node.algorithms import AlgorithmError, Group, NodeContext, NodeProfile, Step, make_algorithm
from dfl_node.algorithms.base import equip, generator_for
from dfl_node.algorithms.messages import state_from_parts
from dfl_node.cli import cli
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.mutual import alpha_at, class_proportions, wsm_loss
from dfl_node.learning.provision import provision
from dfl_node.learning.training import SgdParams, local_sgd
from dfl_node.node.model.persistence import Checkpoint
from dfl_node.results import cluster_accuracy, comparison, rounds_to_reach, write_results
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim import run_fleet

CONFIG = SharedSettings(batch_size=8, mkt_batch_size=8, lr=0.1, momentum=0.0)
OPTIONS = AlgorithmOptions(dfml_epochs=2, meme_model="mlp:8")
UNRELATED = ["mlp:16", "cnn-ln:4,8"]  # two architectures of different kinds


def _node(node_id: str, spec: str, seed: int, config: SharedSettings = CONFIG, algorithm: str = "dfml") -> NodeContext:
    g = torch.Generator().manual_seed(seed)
    data = ArrayDataset(torch.randn(28, 1, 8, 8, generator=g), torch.randint(0, 4, (28,), generator=g), 10)
    parsed = ModelSpec.parse(spec)
    ctx = NodeContext(node_id, parsed.build((1, 8, 8), 10, seed=0), parsed, data.subset(range(24)),
                      data.subset(range(24, 28)), config)
    equip(make_algorithm(algorithm, config, OPTIONS), ctx, seed=0)
    return ctx


def _vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in model.state_dict().values()])


def _round(algo, aggregator: NodeContext, senders: list[NodeContext], step: Step) -> dict:
    algo.local_step(aggregator, step)
    messages = [algo.transmit(s, step) for s in senders]
    replies = algo.aggregate(aggregator, step, sorted(messages, key=lambda m: m.sender))
    for s in senders:
        algo.finish(s, step, replies[s.node_id])
    return replies


def test_dfml_round_mutual_learning_across_architectures_models_go_back_to_their_senders() -> None:
    algo = make_algorithm("dfml", CONFIG, OPTIONS)
    agg, mlp, cnn = _node("a", "mlp:16", 1), _node("b", "mlp:16", 2), _node("c", "cnn-ln:4,8", 3)
    plan = algo.plan_round(3, [NodeProfile(n, "x", 1) for n in ("a", "b", "c", "d")], {})
    step = Step(3, Group("a", ("b", "c")), plan.state)
    alpha = alpha_at(3, 10, 10, 0.0, 0.9)
    assert float(step.state["dfml.alpha"]) == alpha == pytest.approx(0.225)
    w0 = _vector(cnn.model).clone()
    replies = _round(algo, agg, [mlp, cnn], step)
    assert replies["c"].model == "cnn-ln:4,8" and float(replies["c"].metadata["alpha"]) == alpha
    assert {r.purpose for r in replies.values()} == {"dfml.updated"}
    assert not torch.equal(_vector(cnn.model), w0)
    for ctx in (agg, mlp, cnn):  # α = 0.225 ≥ α_n = 0: every participant's peak model follows its regular one
        assert torch.equal(_vector(ctx.auxiliary["peak"]), _vector(ctx.model)) and ctx.scalars["alpha_n"] == alpha
    # a later round with a lower α (a new cycle) leaves the peak models as they were
    low = Step(10, Group("a", ("b", "c")), algo.plan_round(10, [NodeProfile(n, "x", 1) for n in "abcd"], {}).state)
    assert float(low.state["dfml.alpha"]) == 0.0
    peaks = {ctx.node_id: _vector(ctx.auxiliary["peak"]).clone() for ctx in (agg, mlp, cnn)}
    _round(algo, agg, [mlp, cnn], low)
    for ctx in (agg, mlp, cnn):
        assert torch.equal(_vector(ctx.auxiliary["peak"]), peaks[ctx.node_id])
        assert not torch.equal(_vector(ctx.model), peaks[ctx.node_id]) and ctx.scalars["alpha_n"] == alpha


def test_dfml_with_alpha_zero_is_wsm_training_of_each_model_on_the_aggregators_data() -> None:
    """No distillation (α = 0): mutual learning decouples into K passes of each model alone, eq. 2 only."""
    config = CONFIG
    algo = make_algorithm("dfml", config, OPTIONS.model_copy(update={"alpha_max": 0.0}))
    agg, cnn = _node("a", "mlp:16", 1, config), _node("c", "cnn-ln:4,8", 3, config)
    step = Step(0, Group("a", ("c",)), {"dfml.alpha": "0.0", "dfml.peak_alpha": "0.0"})
    message = algo.transmit(cnn, step)
    received = copy.deepcopy(cnn.model)
    algo.local_step(agg, step)
    own = copy.deepcopy(agg.model)
    reply = algo.aggregate(agg, step, [message])["c"]
    beta = class_proportions(agg.train.y, 10)
    params = SgdParams(lr=0.1, momentum=0.0, batch_size=8, epochs=2)  # K = dfml_epochs passes, the MKT batch size
    for model in (own, received):  # each alone, on the aggregator's batches in the aggregator's order
        local_sgd(model, agg.train, params, generator_for(config.seed, 0, "a", "dfml"),
                  loss_fn=lambda z, y: wsm_loss(z, y, beta))
    assert torch.allclose(_vector(agg.model), _vector(own), atol=1e-6)
    updated = ModelSpec.parse(reply.model).build((1, 8, 8), 10)
    updated.load_state_dict(state_from_parts(reply.parts))
    assert torch.allclose(_vector(updated), _vector(received), atol=1e-6)


def test_dfml_refuses_what_it_cannot_fuse() -> None:
    algo = make_algorithm("dfml", CONFIG, OPTIONS)
    agg, sender = _node("a", "mlp:16", 1), _node("b", "cnn-ln:4,8", 2)
    message = algo.transmit(sender, Step(0, Group("a", ("b",)), {}))
    for forged in (replace(message, model="cnn-ln:4,9"), replace(message, model="resnet:1"),
                   replace(message, parts=message.parts[:-1]), replace(message, purpose="fedavg.model")):
        with pytest.raises(AlgorithmError):
            algo.check_message(agg, forged)
    reply = algo.aggregate(agg, Step(0, Group("a", ("b",)), {}), [message])["b"]
    with pytest.raises(AlgorithmError, match="not a mlp:16"):
        algo.finish(agg, Step(0, Group("a", ("b",)), {}), reply)  # a model of another architecture


def test_fml_only_meme_models_travel_and_are_averaged_unweighted() -> None:
    algo = make_algorithm("fml", CONFIG, OPTIONS)
    agg, b, c = (_node(n, spec, s, algorithm="fml") for n, spec, s in (("a", "mlp:16", 1), ("b", "cnn-ln:4,8", 2),
                                                                          ("c", "mlp:16", 3)))
    assert all(str(ModelSpec.parse(OPTIONS.meme_model)) == "mlp:8" for _ in (agg, b, c))
    step = Step(0, Group("a", ("b", "c")))
    algo.local_step(agg, step)
    messages = [algo.transmit(s, step) for s in (b, c)]
    assert {(m.model, m.purpose) for m in messages} == {("mlp:8", "fml.meme")}  # never a local model
    locals_before = {n.node_id: _vector(n.model).clone() for n in (agg, b, c)}
    memes = [_vector(agg.auxiliary["meme"]), *(torch.cat([p.values for p in m.parts]) for m in messages)]
    replies = algo.aggregate(agg, step, messages)
    assert torch.allclose(_vector(agg.auxiliary["meme"]), sum(memes) / 3, atol=1e-6)  # 004: no sample weights
    for s in (b, c):
        algo.finish(s, step, replies[s.node_id])
        assert torch.equal(_vector(s.auxiliary["meme"]), _vector(agg.auxiliary["meme"]))
    for n in (agg, b, c):  # aggregation never touches a local model (only the DML before it did)
        assert torch.equal(_vector(n.model), locals_before[n.node_id])
    assert list(algo.reported_models(agg)) == ["local", "meme"]
    local_model = replace(messages[0], model="mlp:16",
                          parts=tuple(make_algorithm("dfml", CONFIG, OPTIONS).transmit(c, step).parts))
    with pytest.raises(AlgorithmError, match="meme model"):
        algo.check_message(agg, local_model)  # a local model offered as a meme is refused


@pytest.mark.parametrize("name", ["heterofl", "fedrolex", "feddropout"])
def test_partial_training_rounds_keep_every_architecture_and_refuse_other_families(name: str) -> None:
    algo = make_algorithm(name, CONFIG, OPTIONS)
    agg, half, quarter = _node("a", "mlp:16,8", 1), _node("b", "mlp:8,4", 2), _node("c", "mlp:4,2", 3)
    profiles = [NodeProfile("a", "mlp:16,8", 1), NodeProfile("b", "mlp:8,4", 1), NodeProfile("c", "mlp:4,2", 1)]
    plan = algo.plan_round(5, profiles, {})
    step = Step(5, Group("a", ("b", "c")), plan.state)
    replies = _round(algo, agg, [half, quarter], step)
    assert {r.model for r in replies.values()} == {"mlp:8,4", "mlp:4,2"}
    if name == "heterofl":  # eq. 8: the smallest model's units are the first of everybody's, so they agree
        assert torch.equal(quarter.model.state_dict()["1.bias"], half.model.state_dict()["1.bias"][:4])
        assert torch.equal(half.model.state_dict()["1.bias"], agg.model.state_dict()["1.bias"][:8])
    if name == "fedrolex":
        assert plan.state == {"fedrolex.t": "5"}
        # Alg. 3 rolls every participant's units by t̃, the largest's too: a relabelling of W_g's units, so the
        # round ends exactly as HeteroFL's
        outcomes = []
        for variant in (algo, make_algorithm("heterofl", CONFIG, OPTIONS)):
            nodes = _node("a", "mlp:16,8", 1), _node("b", "mlp:8,4", 2), _node("c", "mlp:4,2", 3)
            _round(variant, nodes[0], list(nodes[1:]), step)
            outcomes.append([_vector(n.model) for n in nodes])
        assert all(torch.equal(x, y) for x, y in zip(*outcomes))
        anchored = make_algorithm(name, CONFIG, OPTIONS.model_copy(update={"fedrolex_roll_largest": False}))
        agg, half, quarter = _node("a", "mlp:16,8", 1), _node("b", "mlp:8,4", 2), _node("c", "mlp:4,2", 3)
        _round(anchored, agg, [half, quarter], step)
        t = 5 % 16  # W_g is the largest model as it is: the rate-¼ model's first layer is its units 5 … 8
        assert torch.equal(quarter.model.state_dict()["1.bias"], agg.model.state_dict()["1.bias"][t:t + 4])
        assert not torch.equal(_vector(quarter.model), outcomes[0][2])
    with pytest.raises(AlgorithmError, match="cannot fuse"):
        algo.plan_round(0, [*profiles, NodeProfile("d", "cnn-ln:4,8", 1)], {})
    with pytest.raises(AlgorithmError):
        algo.check_message(agg, make_algorithm("dfml", CONFIG, OPTIONS).transmit(_node("d", "cnn-ln:4,8", 4), step))


def test_auxiliary_models_and_scalars_survive_a_checkpoint(tmp_path) -> None:
    node = _node("a", "mlp:16", 1)
    with torch.no_grad():
        node.auxiliary["peak"].state_dict()["1.weight"].add_(1.0)
    node.scalars["alpha_n"] = 0.7321
    checkpoint = Checkpoint(tmp_path)
    checkpoint.save(node.checkpoint_state(), "fp", {})
    fresh = _node("a", "mlp:16", 1)
    assert not torch.equal(_vector(fresh.auxiliary["peak"]), _vector(node.auxiliary["peak"]))
    fresh.restore_checkpoint(checkpoint.load("fp")[0])
    assert torch.equal(_vector(fresh.auxiliary["peak"]), _vector(node.auxiliary["peak"]))
    assert torch.equal(_vector(fresh.model), _vector(node.model)) and fresh.scalars == {"alpha_n": 0.7321}
    fresh.restore_checkpoint(dict(fresh.model.state_dict()))  # a checkpoint without them: w0 stays
    assert fresh.scalars == {"alpha_n": 0.7321}


def test_dfml_fml_and_partial_training_learn_in_the_simulator(tmp_path) -> None:
    base = ExperimentConfig(nodes=4, rounds=12, eval_every=6, batch_size=20, mkt_batch_size=20, lr=0.05, seed=1,
                            architectures=UNRELATED, dfml_epochs=1, meme_model="mlp:16", algorithms=["dfml"])
    fleet = provision(base)
    dfml = run_fleet(base, "dfml", data=fleet)
    assert list(dfml.history[-1].series) == ["regular"]  # the peak models are the node's; regular beside them
    assert dfml.history[-1].global_accuracy > dfml.history[0].global_accuracy + 0.3
    assert {n.model for n in dfml.nodes} == set(UNRELATED) and set(cluster_accuracy(dfml)) == set(UNRELATED)
    fml = run_fleet(base, "fml", data=fleet)
    assert list(fml.history[-1].series) == ["meme"] and fml.history[-1].series["meme"].global_accuracy > 0.5
    widths = base.model_copy(update={"architectures": ["mlp:32,32", "mlp:16,16", "mlp:8,8"]})
    runs = [run_fleet(widths, name, data=fleet) for name in ("heterofl", "fedrolex", "fedavg")]
    assert all(r.history[-1].global_accuracy > r.history[0].global_accuracy + 0.2 for r in runs)
    table = comparison([dfml, *runs], "fedavg")
    reached = rounds_to_reach(runs[-1], table["baseline_final_global_accuracy"])  # fedavg's own: at most 12
    assert table["runs"]["fedavg"]["rounds_to_baseline_final"] == reached
    assert table["runs"]["fedavg"]["speedup"] == 12 / reached
    assert set(table["runs"]["dfml"]["series"]) == {"regular"}
    # dfl-node plot: dashed series, the per-cluster figure (003 Fig. 5) and the --baseline comparison (Table 8)
    paths = []
    for run in (dfml, runs[-1]):
        json_path, _ = write_results(run, tmp_path / run.algorithm)
        assert json.loads(json_path.read_text())["clusters"] == cluster_accuracy(run)
        paths.append(str(json_path))
    out = tmp_path / "cmp.png"
    shown = CliRunner().invoke(cli, ["plot", *paths, "-o", str(out), "--baseline", "fedavg"], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert out.is_file() and (tmp_path / "cmp-clusters.png").is_file() and "dfml" in shown.output
    assert json.loads((tmp_path / "cmp.json").read_text())["runs"].keys() == {"dfml", "fedavg"}
    assert CliRunner().invoke(cli, ["plot", *paths, "-o", str(out), "--baseline", "defkt"]).exit_code == 2
