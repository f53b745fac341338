"""Links that drop and devices that crawl, in the simulator (the daemon's own nodes on the virtual clock): a model
whose connection is cut resumes from what arrived, so a round-mode fleet over links that drop ends with the models of
the same fleet over perfect links, bit for bit — pushes, replies and pulls alike; a link that can never carry a model
is planned around; slow devices are waited for, as their measured speed says, and take part.

The same over gRPC, through a proxy that cuts real connections, is ``test_weak_links.py``'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfl_node.algorithms.base import sample_pairs
from dfl_node.learning.provision import fleet_ids
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.simulation import DeviceClass, LinkClass
from dfl_node.sim.experiment import run_fleet

# 3 nodes, the MLP large enough (340 KB) to need several 64 KiB chunks, node-0 on a link of 1 Mbit/s whose
# connections last 2 s on average: each model to or from it takes ~3 s, so most are cut once or more.
FLEET = ExperimentConfig(nodes=3, partition="iid", seed=3, rounds=8, eval_every=4, batch_size=20, mkt_batch_size=20,
                         lr=0.05, hidden=[256, 256])
CELLULAR = {"links": {"cellular": LinkClass(latency_s=0.05, bandwidth_mbps=1.0, mtbf_s=2.0)},
            "devices": {"phone": DeviceClass(nodes=1, link="cellular")}}


def with_links(config: ExperimentConfig, **simulation: object) -> ExperimentConfig:
    return config.model_copy(update={"simulation": config.simulation.model_copy(update=simulation)})


@pytest.mark.parametrize("algorithm", ["defkt", "combo", "gossip"])  # pushes; replies (Combo's segment); pulls
def test_a_fleet_over_links_that_drop_ends_as_over_perfect_links_bit_for_bit(tmp_path: Path, algorithm: str) -> None:
    perfect = run_fleet(FLEET, algorithm, tmp_path / "perfect")
    dropping = run_fleet(with_links(FLEET, **CELLULAR), algorithm, tmp_path / "dropping")
    assert dropping.rounds == perfect.rounds == FLEET.rounds
    assert [n.param_sha256 for n in dropping.nodes] == [n.param_sha256 for n in perfect.nodes]
    assert dropping.transfers_cut > 0 and dropping.groups_replanned == 0, dropping.nodes  # cut, and resumed
    assert perfect.transfers_cut == perfect.bytes_resent == 0
    # a resumed transfer carries what is missing (and the chunks cut halfway): a fraction more than a perfect link
    assert perfect.bytes_transmitted < dropping.bytes_transmitted < 1.5 * perfect.bytes_transmitted
    if algorithm != "gossip":  # a push's sender knows what it sent again (a pull's model is streamed by its source)
        assert 0 < dropping.bytes_resent < 0.5 * perfect.bytes_transmitted


def test_a_link_that_never_carries_a_model_is_planned_around_and_the_fleet_goes_on(tmp_path: Path) -> None:
    """node-0's connections last 0.2 s on average at 1 Mbit/s: never long enough for a 64 KiB chunk (0.5 s). Its
    groups fail ``group_attempts`` times and the round is played by the others; no round is lost or played
    twice."""
    config = with_links(FLEET.model_copy(update={"nodes": 4, "rounds": 6}), devices=CELLULAR["devices"],
                        links={"cellular": LinkClass(latency_s=0.05, bandwidth_mbps=1.0, mtbf_s=0.2)})
    plans = [g for r in range(6) for g in sample_pairs(FLEET.learning.seed, r, fleet_ids(4), 1)]
    assert any("node-0" in g.members for g in plans)  # the weak node is planned into some rounds
    result = run_fleet(config, "defkt", tmp_path, resume_window=2.0, round_timeout=20.0)
    assert result.rounds == 6
    assert result.groups_replanned == sum("node-0" in g.members for g in plans)
    weak = next(n for n in result.nodes if n.id == "node-0")
    assert weak.models_sent == 0 and weak.models_received == 0  # nothing crossed its link
    others = [n for n in result.nodes if n.id != "node-0"]
    assert sum(n.models_sent for n in others) == 6  # one exchange a round all the same (Q = 1)


def test_slow_devices_are_waited_for_as_their_speed_says_and_take_part(tmp_path: Path) -> None:
    """Two of four devices 500 times slower than the others (a second a training step): a training or a fusion
    there takes longer than ``round_timeout``. Each group's deadline follows its members' computation — estimated
    from their first evaluation, then measured role by role, as their Hellos' ``work_s`` say — so every round
    completes with the plan's pairs, the slow devices in each one they were planned into, and none played twice."""
    config = with_links(FLEET.model_copy(update={"nodes": 4, "rounds": 20, "hidden": [32, 32]}),
                        devices={"slow": DeviceClass(nodes=2, step_s=1.0, eval_sample_s=1e-3)})
    result = run_fleet(config, "defkt", tmp_path, round_timeout=10.0)
    slow = [n for n in result.nodes if n.id in ("node-0", "node-1")]
    plans = [g for r in range(20) for g in sample_pairs(FLEET.learning.seed, r, fleet_ids(4), 1)]
    planned = sum(any(m in g.members for m in ("node-0", "node-1")) for g in plans)
    assert result.rounds == 20 and result.groups_replanned == 0
    assert sum(n.models_sent + n.models_received for n in slow) == sum(
        sum(m in g.members for m in ("node-0", "node-1")) for g in plans) > 0  # each time it was planned in
    assert planned > 0


def test_an_async_fleet_over_links_that_drop_fuses_every_model_it_sends(tmp_path: Path) -> None:
    """Async mode on LTE and edge-of-coverage links: a sender whose stream is cut while it waits for its
    confirmation resumes and gets it (the aggregator's confirmation is shared by every stream of the transfer, never
    cancelled with one), so no transfer is refused and every model sent is fused once."""
    config = with_links(FLEET.model_copy(update={"nodes": 10, "seed": 0}),
                        links={"lte": LinkClass(latency_s=0.04, bandwidth_mbps=10, mtbf_s=120),
                               "edge": LinkClass(latency_s=0.12, bandwidth_mbps=0.5, mtbf_s=8)},
                        devices={"phone": DeviceClass(nodes=7, link="lte", step_s=0.05),
                                 "sensor": DeviceClass(nodes=3, link="edge", step_s=0.2)})
    result = run_fleet(config, "defkt", tmp_path, mode="async", duration=600, interval=30)
    assert result.transfers_cut > 20 and result.rounds > 100, result.nodes
    assert not any(n.rejected for n in result.nodes), [n.rejected for n in result.nodes]  # before: not_expected
    assert sum(n.models_sent for n in result.nodes) == sum(n.models_received for n in result.nodes) == result.rounds
