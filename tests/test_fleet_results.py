"""A fleet's accuracy curve (:func:`dfl_node.fleet_results.accuracy_curve`) against its rule written plainly: at
each point, each node's last evaluation at or before it, the bytes its last entry had received, and the time of the
last entry counted; a point is left out until every node was evaluated."""

from __future__ import annotations

import random

from dfl_node.fleet_results import Positions, accuracy_curve


def plain_curve(positions: Positions, points: list[int], started: float) -> list[tuple]:
    curve = []
    for point in points:
        reached = {i: [h for x, h in entries if x <= point] for i, entries in positions.items()}
        known = {i: [h for h in hs if h["global_accuracy"] is not None] for i, hs in reached.items()}
        if not all(known.values()):
            continue
        latest = {i: hs[-1] for i, hs in known.items()}
        last = max(h["time"] for hs in reached.values() for h in hs)
        curve.append((point, sum(h["global_accuracy"] for h in latest.values()) / len(latest),
                      {i: h["local_accuracy"] for i, h in latest.items()},
                      sum(hs[-1].get("bytes_received", 0) for hs in reached.values()), max(0.0, last - started)))
    return curve


def test_the_curve_takes_each_nodes_last_evaluation_at_or_before_each_point() -> None:
    rng = random.Random(7)
    for _ in range(50):
        positions: Positions = {}
        for node in range(rng.randint(1, 6)):
            at, entries = 0, []
            for _ in range(rng.randint(0, 12)):
                at += rng.choice((0, 0, 1, 3))  # positions ascend, several entries at one
                evaluated = rng.random() < 0.6
                entries.append((at, {"time": 100.0 + rng.random() * 50,
                                     "global_accuracy": rng.random() if evaluated else None,
                                     "local_accuracy": rng.random() if evaluated else None,
                                     "bytes_received": rng.randint(0, 10**6)}))
            positions[f"node-{node}"] = entries
        points = sorted({*range(0, 30, rng.choice((1, 2, 5))), 30})
        curve = [(r.round, r.global_accuracy, r.per_node_local, r.bytes_transmitted, r.wall_time_s)
                 for r in accuracy_curve(positions, points, started=110.0)]
        assert curve == plain_curve(positions, points, started=110.0)
