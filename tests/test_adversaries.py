"""The simulator's adversaries: which nodes are compromised, what each attack sends, and a fleet of
real nodes under attack, without and with a defence."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dfl_node.algorithms import Group, NodeContext, Step, make_algorithm
from dfl_node.algorithms.base import sample_pairs
from dfl_node.algorithms.combo import Combo
from dfl_node.algorithms.defkt import DefKT
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.learning.provision import TRAIN_FILE, fleet_ids, provision
from dfl_node.results import RunResult
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.simulation import Adversaries
from dfl_node.sim import run_fleet
from dfl_node.sim.adversaries import adversary_nodes, compromised_algorithm, poisoned_fleet
from tests.helpers.cli import error_lines, invoke
from tests.helpers.contexts import TINY_SETTINGS, tiny_context

SEND = Step(0, Group("b", ("a",)))  # round 0: node a sends to node b


def sent(algorithm: str, attack: str | None, seed: int = 0) -> tuple[ModelMessage, NodeContext]:
    """What node a sends in round 0, honest (``attack`` None) or compromised, and its context after."""
    ctx = tiny_context("a", seed)
    adversary = Adversaries.model_validate(attack) if attack else None
    algo = (compromised_algorithm(algorithm, TINY_SETTINGS, None, adversary) if adversary
            else make_algorithm(algorithm, TINY_SETTINGS))
    assert algo is not None
    return algo.transmit(ctx, SEND), ctx


def values(message: ModelMessage) -> torch.Tensor:
    return torch.cat([p.values for p in message.parts])


# ----------------------------------------------------------------------------- the settings


def test_adversaries_are_written_kind_fraction_and_strength() -> None:
    config = ExperimentConfig(adversaries=["sign-flip:0.2", "noise:0.1:0.5", {"kind": "free-rider", "fraction": 0.1}])
    adversaries = config.simulation.adversaries
    assert [str(a) for a in adversaries] == ["sign-flip:0.2", "noise:0.1:0.5", "free-rider:0.1"]
    assert [a.size for a in adversaries] == [1.0, 0.5, 0.0]
    assert ExperimentConfig.model_validate(config.flat(mode="json")).simulation.adversaries == adversaries


@pytest.mark.parametrize(("flag", "problem"), [
    ("bogus:0.2", "--adversaries: item 1 must be 'sign-flip', 'scale', 'noise', 'label-flip', 'false-count' or "
                  "'free-rider' (got bogus)"),
    ("sign-flip", "--adversaries: 'sign-flip' is not KIND:FRACTION[:STRENGTH] (e.g. sign-flip:0.2)"),
    ("label-flip:0.2:3", "--adversaries: label-flip takes no strength (got 3)"),
    ("noise:1.5", "--adversaries: item 1 must be < 1 (got 1.5)"),
])
def test_a_bad_adversary_is_one_line_and_exit_2(clean_env: None, flag: str, problem: str) -> None:
    result = invoke("simulate", "--adversaries", flag)
    assert result.exit_code == 2 and error_lines(result) == [f"Error: {problem}"]


def test_a_fleet_with_no_honest_node_left_is_refused(clean_env: None) -> None:
    result = invoke("simulate", "--nodes", "4", env={"DFL_ADVERSARIES": "noise:0.5,scale:0.5"})
    assert result.exit_code == 2
    assert error_lines(result) == ["Error: adversaries noise:0.5, scale:0.5 compromise 4 of 4 nodes: no honest node "
                                   "would be left"]


def test_a_testbed_of_daemons_plays_no_adversary(clean_env: None) -> None:
    result = invoke("testbed", "--adversaries", "noise:0.1")
    assert result.exit_code == 2 and "a testbed's daemons are all honest" in error_lines(result)[0]


def test_the_compromised_nodes_are_seeded_and_nested() -> None:
    def chosen(fraction: float, seed: int = 0) -> set[str]:
        return set(adversary_nodes(ExperimentConfig(nodes=10, seed=seed, adversaries=[f"sign-flip:{fraction}"])))

    assert [len(chosen(f)) for f in (0.1, 0.2, 0.3, 0.04)] == [1, 2, 3, 1]  # rounded, at least one
    assert chosen(0.1) < chosen(0.2) < chosen(0.3)  # 10 % of a fleet are among its 20 %
    assert chosen(0.3) == chosen(0.3) and {frozenset(chosen(0.3, s)) for s in range(5)} != {frozenset(chosen(0.3))}
    mixed = adversary_nodes(ExperimentConfig(nodes=10, adversaries=["sign-flip:0.2", "label-flip:0.1"]))
    assert Counter(a.kind for a in mixed.values()) == {"sign-flip": 2, "label-flip": 1}


# ----------------------------------------------------------------------------- what each attack sends


def test_a_compromised_algorithm_is_still_its_algorithm() -> None:
    algo = compromised_algorithm("defkt", TINY_SETTINGS, None, Adversaries(kind="sign-flip", fraction=0.1))
    assert isinstance(algo, DefKT) and algo.name == "defkt"
    assert compromised_algorithm("defkt", TINY_SETTINGS, None, Adversaries(kind="label-flip", fraction=0.1)) is None


def test_sign_flip_scale_and_noise_change_the_model_as_it_leaves() -> None:
    honest, ctx = sent("defkt", None)
    trained = values(honest)
    before = torch.cat([t.reshape(-1) for t in ctx.model.state_dict().values()])  # Def-KT's sender keeps its model
    flipped, flipped_ctx = sent("defkt", "sign-flip:0.1")
    assert torch.equal(values(flipped), -trained) and flipped.num_samples == honest.num_samples
    assert all(torch.equal(a, b) for a, b in zip(flipped_ctx.model.state_dict().values(),
                                                 ctx.model.state_dict().values()))  # its own model: untouched
    boosted, _ = sent("defkt", "scale:0.1:10")
    assert torch.allclose(values(boosted), before + 10 * (trained - before), atol=1e-6)
    noisy, again = sent("defkt", "noise:0.1:0.5")[0], sent("defkt", "noise:0.1:0.5")[0]
    assert torch.equal(values(noisy), values(again))  # seeded: the same run sends the same noise
    assert 0.45 < float((values(noisy) - trained).std()) < 0.55


def test_false_count_claims_its_strength_in_samples() -> None:
    honest, _ = sent("fullavg", None)
    lying, _ = sent("fullavg", "false-count:0.1")
    assert lying.num_samples == 10**9 and honest.num_samples == 32 and torch.equal(values(lying), values(honest))


def test_a_free_rider_sends_back_what_it_received_never_what_it_trained() -> None:
    rider = tiny_context("b", seed=1)
    start = copy.deepcopy(rider.model.state_dict())
    algo = compromised_algorithm("combo", TINY_SETTINGS, None, Adversaries(kind="free-rider", fraction=0.1))
    assert isinstance(algo, Combo)
    first = algo.transmit(rider, SEND)  # nothing received yet: the model it had before it trained
    assert all(torch.equal(p.values, start[p.name].reshape(-1)[p.start : p.start + p.values.numel()])
               for p in first.parts)
    peer = tiny_context("a", seed=2)
    with torch.no_grad():
        for p in peer.model.parameters():
            p.add_(1.0)  # a model unlike anything the rider holds
    segment = make_algorithm("combo", TINY_SETTINGS).transmit(peer, SEND)
    reply = algo.aggregate(rider, Step(0, Group("b", ("a",))), [segment])["a"]
    peer_state = peer.model.state_dict()  # the peer trained in place: these are the values it sent
    assert all(torch.equal(p.values, start[p.name].reshape(-1)[p.start : p.start + p.values.numel()])
               for p in reply.parts)  # the reply's segments: never received, so as it started
    later = algo.transmit(rider, Step(1, Group("x", ("b",))))
    received = {(p.name, p.start) for p in segment.parts}
    assert any((p.name, p.start) in received for p in later.parts)
    for part in later.parts:
        if (part.name, part.start) in received:  # what it received it sends on as it came
            expected = peer_state[part.name].reshape(-1)[part.start : part.start + part.values.numel()]
            assert torch.equal(part.values, expected)


def test_label_flip_poisons_only_the_adversarys_own_shard() -> None:
    config = ExperimentConfig(nodes=4, partition="iid", seed=3, adversaries=["label-flip:0.25"])
    fleet = provision(config)
    flipped = poisoned_fleet(fleet, adversary_nodes(config))
    for before, after in zip(fleet.clients, flipped.clients):
        if before.node_id in adversary_nodes(config):
            assert torch.equal(after.train.y, 9 - before.train.y) and torch.equal(after.val.y, 9 - before.val.y)
        else:
            assert after is before


# ----------------------------------------------------------------------------- a fleet under attack

FLEET = ExperimentConfig(nodes=6, partition="iid", seed=3, rounds=12, eval_every=12, batch_size=20,
                         mkt_batch_size=20, lr=0.05, hidden=[32, 32], pairs=3, threads=1)


def simulate(**settings: object) -> RunResult:
    return run_fleet(ExperimentConfig(**{**FLEET.flat(), **settings}), "defkt")


def refusals(result: RunResult) -> Counter[str]:
    total: Counter[str] = Counter()
    for n in result.nodes:
        total.update(n.rejected)
    return total


def test_a_sign_flipping_member_poisons_defkt_and_the_norm_bound_refuses_exactly_its_models() -> None:
    free, bounded = simulate(), simulate(norm_bound=0.5)
    attacked, defended = simulate(adversaries=["sign-flip:0.17"]), simulate(adversaries=["sign-flip:0.17"],
                                                                            norm_bound=0.5)
    # the bound in a fleet without adversaries refuses nothing and changes nothing, bit for bit
    assert [n.param_sha256 for n in bounded.nodes] == [n.param_sha256 for n in free.nodes] and not refusals(bounded)
    [adversary] = attacked.adversaries
    assert attacked.adversaries == defended.adversaries == {adversary: "sign-flip:0.17"}
    assert [n.id for n in attacked.honest] == [i for i in fleet_ids(6) if i != adversary]
    assert attacked.honest_global_accuracy < free.honest_global_accuracy - 0.08  # the attack costs the honest nodes
    assert defended.honest_global_accuracy > free.honest_global_accuracy - 0.03  # the bound takes nearly all back
    sends = sum(adversary in g.senders for r in range(FLEET.rounds)
                for g in sample_pairs(FLEET.learning.seed, r, fleet_ids(6), FLEET.learning.pairs))
    assert sends > 0 and refusals(defended) == {"norm_bound": sends}  # each of its models, and nothing else
    assert refusals(attacked) == {}


def test_label_flippers_train_on_their_flipped_shard_in_the_simulator(tmp_path: Path) -> None:
    result = run_fleet(ExperimentConfig(**{**FLEET.flat(), "rounds": 2, "adversaries": ["label-flip:0.17"]}),
                       "defkt", tmp_path)
    [adversary] = result.adversaries
    clean = {c.node_id: c.train.y for c in provision(FLEET).clients}
    for node_id, labels in clean.items():
        on_disk = load_file(str(tmp_path / "shards" / node_id / TRAIN_FILE))
        expected = 9 - labels if node_id == adversary else labels
        assert torch.equal(next(v for k, v in on_disk.items() if v.dtype == torch.int64), expected), node_id


def test_a_sample_cap_bounds_a_false_count_in_fedavg_and_counts_it() -> None:
    config = {**FLEET.flat(), "rounds": 6, "adversaries": ["false-count:0.17"]}
    lied = run_fleet(ExperimentConfig(**config), "fedavg")
    capped = run_fleet(ExperimentConfig(**{**config, "sample_cap": 2.0}), "fedavg")
    assert not refusals(lied) and set(refusals(capped)) == {"sample_count"}
    assert [n.param_sha256 for n in lied.nodes] != [n.param_sha256 for n in capped.nodes]
