"""A model through a relay against the same model direct, on loopback (the target: ≤ 1.5×).

Two real ``dfl-node start`` daemons: a relay (``relay``, reachable: a loopback node is direct) and a receiver
(``node-1``, started with ``--relay`` naming it, so it holds a slot there and advertises the slot). The sender is
this process, the daemon's own client (:class:`~dfl_node.net.client.PeerClient`), as in
``benchmarks/transfer.py``: the ~100 MB model of :mod:`_daemon` pushed ``--repeat`` times to the receiver's own
port (``direct``) and ``--repeat`` times to its slot on the relay (``relayed``: sender → relay → the receiver's
outbound tunnel → its server), in alternating blocks so that drift on a noisy machine falls on both. ``wire_s`` is
the header to the receiver's verdict; ``durable_s`` adds its fusion and checkpoint (the same work either way). The
relay's counters (bytes, connections) come from its ``/status``. All three processes share this machine's cores.

Prints one JSON object.

    python benchmarks/relay.py [--repeat 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from _daemon import RECEIVER_ID, Daemon, bench_model, daemon  # benchmarks/_daemon.py
from transfer import Push, measure_stream  # benchmarks/transfer.py

from dfl_node.net.allocator import tune_for_streaming

RELAY_ID = "node-0"  # the benchmark fleet's other shard


def wait_for_slot(receiver: Daemon, timeout: float = 120.0) -> str:
    """The receiver's advertised address once it holds a slot on its relay."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and receiver.process.poll() is None:
        try:
            status = httpx.get(receiver.status_url, trust_env=False).json()
        except httpx.HTTPError:
            status = {}
        if status.get("reachability") == "relayed":
            return str(status["grpc_address"])
        time.sleep(0.2)
    raise SystemExit(f"error: the receiver held no relay slot within {timeout:g} s (exit code "
                     f"{receiver.process.poll()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=4, help="pushes each way, in alternating blocks of one")
    args = parser.parse_args()
    tune_for_streaming()
    work = Path(tempfile.mkdtemp(prefix="dfl-bench-relay-"))
    bench = bench_model(work, purpose="fullavg.model")
    series: dict[str, list[Push]] = {"direct": [], "relayed": []}
    with (daemon(work, "fullavg", node_id=RELAY_ID) as relay,
          daemon(work, "fullavg", env={"DFL_RELAY": relay.address}) as receiver):
        slot = wait_for_slot(receiver)
        addresses = {"direct": receiver.address, "relayed": slot}
        for i in range(args.repeat):
            for j, (way, address) in enumerate(addresses.items()):
                _, pushes, _ = asyncio.run(measure_stream(bench, bench.wire.hashes, address, receiver.status_url,
                                                          receiver.pid, 1, first_round=2 * i + j))
                series[way] += pushes
        load = httpx.get(relay.status_url, trust_env=False).json()["relaying"]

    def median(way: str, of: str) -> float:
        pushes = series[way]
        return statistics.median(p.wire_s + (p.confirm_s if of == "durable" else 0.0) for p in pushes)

    size = bench.payload_bytes
    report = {
        "benchmark": "relay", "model_mb": round(size / 1e6, 1), "repeat": args.repeat, "receiver": RECEIVER_ID,
        "relay_slot": slot,
        **{f"{way}_wire_s": round(median(way, "wire"), 3) for way in series},
        **{f"{way}_durable_s": round(median(way, "durable"), 3) for way in series},
        "relayed_vs_direct_wire": round(median("relayed", "wire") / median("direct", "wire"), 2),
        "relayed_vs_direct_durable": round(median("relayed", "durable") / median("direct", "durable"), 2),
        "relay_load": load,
        "times_s": {way: [round(p.wire_s, 3) for p in pushes] for way, pushes in series.items()},
    }
    report["targets"] = {"relayed_vs_direct_wire <= 1.5": report["relayed_vs_direct_wire"] <= 1.5}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
