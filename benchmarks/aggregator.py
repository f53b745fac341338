"""An aggregator's intake: N concurrent ~100 MB models into a real daemon, against a single stream.

This process plays the round-token holder and the senders of protocol v2: it assigns a real
``dfl-node start`` daemon (round mode, no peers, no mDNS, no evaluation) the aggregator role of a
group (``Assign(RoundAssignment(role="aggregator", senders=[...]))``), then streams each sender's
model to it with :meth:`PeerClient.push`, all at once, one channel (TCP connection) per sender, as
separate sender nodes would. Each repetition is a fresh group (the next round number).

* **Intake rate**: the payload bytes of the group / wall time from the first byte written to the
  last sender's verdict (the aggregator answers each transfer once it is validated and collected,
  before it aggregates). For a group of N = ``--senders`` and for a group of one sender, and their ratio.
* **Peak RSS** of the aggregator over its idle RSS (measured once it is up, before any transfer),
  as a multiple of the model size: over the whole round (intake, the algorithm's local step and
  aggregation, replies, checkpoint; VmHWM reset before each round, and VmRSS polled every 10 ms)
  and during the intake alone (polled). The issue's target: peak < (N + 2) × model size.
  Receive buffers are pooled across transfers, so the first repetition is reported on its own too.
* CPU seconds of the aggregator and of this process (all senders) during the intake, to tell
  which side bounds the rate: both share this machine's cores, as loopback tests must.

With ``fedavg`` (the default) the aggregator trains locally while the models arrive, averages them
with its own and sends each sender the average, which this process reads so the round completes;
``fullavg`` / ``defkt`` aggregate in place and send nothing back.
Prints one JSON object. Linux only (``/proc``); run as root so that VmHWM can be reset.

    python benchmarks/aggregator.py [--repeat 3] [--senders 4] [--algorithm fedavg]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
from _daemon import (  # benchmarks/_daemon.py
    RECEIVER_ID,
    BenchModel,
    Daemon,
    RssSampler,
    bench_model,
    cpu_seconds,
    daemon,
    reset_peak,
    vm,
    wait_idle,
)

from dfl_node.net.allocator import tune_for_streaming
from dfl_node.net.client import PeerClient
from dfl_node.net.encoder import Outgoing
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.messages import Assignment

HOLDER = "bench-holder"
DEADLINE_S = 300.0


@dataclass
class Repetition:
    senders: int
    round: int
    intake_s: float
    idle_before: int  # aggregator VmRSS just before the Assign
    intake_peak: int  # polled VmRSS peak from the first byte to the last verdict
    round_peak: int  # max(VmHWM, polled VmRSS) from the Assign until the aggregator is idle again
    round_s: float  # Assign to idle
    aggregator_cpu_s: float  # during the intake
    client_cpu_s: float  # this process, during the intake
    status: dict = field(repr=False)


def outgoing_for(base: Outgoing, sender: str, round_: int) -> Outgoing:
    """``base`` as sent by ``sender`` in ``round_``: the payload and its sha256 are the same, only the header
    differs."""
    header = pb.TransferHeader()
    header.CopyFrom(base.header)
    header.sender, header.round = sender, round_
    return Outgoing(header, base.raws)


async def play_group(bench: BenchModel, base: Outgoing, agg: Daemon, holder: PeerClient, clients: list[PeerClient],
                     http: httpx.AsyncClient, sampler: RssSampler, round_: int) -> Repetition:
    """One group: assign the aggregator, push every sender's model at once, wait until it is idle again."""
    senders = [f"bench-sender-{i}" for i in range(len(clients))]
    outgoing = [outgoing_for(base, s, round_) for s in senders]
    before = await wait_idle(http, agg.status_url)
    idle_before = vm(agg.pid, "VmRSS")
    reset_peak(agg.pid)
    sampler.mark()
    started = time.perf_counter()
    ack = await holder.assign(Assignment(
        role="aggregator", round=round_, epoch=0, holder=HOLDER, aggregator=RECEIVER_ID, senders=tuple(senders),
        deadline_s=DEADLINE_S), timeout=60)
    if not ack.ok:
        raise RuntimeError(f"the aggregator refused round {round_}: {ack.reason}")

    verdicts: list[float] = []
    intake: dict[str, float] = {}

    def accepted() -> None:
        verdicts.append(time.perf_counter())
        if len(verdicts) == len(clients):  # the last verdict: the intake is over
            intake.update(peak=sampler.mark(), cpu=cpu_seconds(agg.pid), client=time.process_time())

    cpu0, client0 = cpu_seconds(agg.pid), time.process_time()
    first_byte = time.perf_counter()
    results = await asyncio.gather(*(c.send(o, timeout=DEADLINE_S, on_accepted=accepted)
                                     for c, o in zip(clients, outgoing)))
    del results  # the replies (fedavg's averages), read so that the round completes
    status = await wait_idle(http, agg.status_url)
    round_s = time.perf_counter() - started
    round_peak = max(intake["peak"], sampler.mark(), vm(agg.pid, "VmHWM"))
    received = status["models_received"] - before["models_received"]
    if received != len(clients) or status["rejected"] != before["rejected"]:
        raise RuntimeError(f"round {round_}: {received} models received of {len(clients)}, "
                           f"rejected {status['rejected']}")
    return Repetition(len(clients), round_, max(verdicts) - first_byte, idle_before, int(intake["peak"]), round_peak,
                      round_s, intake["cpu"] - cpu0, intake["client"] - client0, status)


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "kernel": platform.release()}


def summary(reps: list[Repetition], size: int, idle: int) -> dict:
    """Median figures of a series of groups of the same size, and the first one's peak apart."""
    n = reps[0].senders
    rates = [n * size / 1e6 / r.intake_s for r in reps]

    def x(value: float) -> float:
        return round(value / size, 2)

    peaks = [x(r.round_peak - idle) for r in reps]
    return {
        "senders": n,
        "intake_mb_s": round(statistics.median(rates), 1),
        "intake_s": round(statistics.median(r.intake_s for r in reps), 3),
        "peak_rss_increase_x_model": statistics.median(peaks),
        "first_peak_rss_increase_x_model": peaks[0],
        "max_peak_rss_increase_x_model": max(peaks),
        "intake_peak_rss_increase_x_model": statistics.median(x(r.intake_peak - idle) for r in reps),
        "target_x_model": n + 2,
        "meets_target": max(peaks) < n + 2,
        "round_s": round(statistics.median(r.round_s for r in reps), 2),
        "aggregator_cpu_during_intake": round(statistics.median(r.aggregator_cpu_s / r.intake_s for r in reps), 2),
        "senders_cpu_during_intake": round(statistics.median(r.client_cpu_s / r.intake_s for r in reps), 2),
        "per_repetition": [
            {"round": r.round, "intake_mb_s": round(rate, 1), "intake_s": round(r.intake_s, 3),
             "round_s": round(r.round_s, 2),
             "idle_before_x_model": x(r.idle_before - idle), "intake_peak_x_model": x(r.intake_peak - idle),
             "round_peak_x_model": x(r.round_peak - idle),
             "aggregator_cpu_s": round(r.aggregator_cpu_s, 2), "senders_cpu_s": round(r.client_cpu_s, 2)}
            for r, rate in zip(reps, rates)
        ],
    }


async def measure(bench: BenchModel, agg: Daemon, senders: int, repeat: int) -> dict:
    base = bench.wire.prepare(bench.message)  # one sha256 pass; each sender's header is a copy of this one
    holder = PeerClient(agg.address, bench.wire)
    group = [PeerClient(agg.address, bench.wire) for _ in range(senders)]  # a channel per sender, as separate nodes
    single = [PeerClient(agg.address, bench.wire)]
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            for client in (holder, *group, *single):
                await asyncio.wait_for(client.channel.channel_ready(), 120)
            await wait_idle(http, agg.status_url)
            idle = vm(agg.pid, "VmRSS")  # the aggregator up, before any transfer
            with RssSampler(agg.pid) as sampler:
                round_ = 0
                many, one = [], []
                for _ in range(repeat):
                    many.append(await play_group(bench, base, agg, holder, group, http, sampler, round_))
                    round_ += 1
                for _ in range(repeat):
                    one.append(await play_group(bench, base, agg, holder, single, http, sampler, round_))
                    round_ += 1
    finally:
        for client in (holder, *group, *single):
            await client.close()
    return {"idle": idle, "many": many, "one": one}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="groups of each size (median reported)")
    parser.add_argument("--senders", type=int, default=4, help="N, the senders of the concurrent group")
    parser.add_argument("--algorithm", default="fedavg", choices=["fedavg", "fedprox", "fullavg", "defkt"],
                        help="the aggregator's algorithm (fedavg answers every sender with the average)")
    args = parser.parse_args()
    tune_for_streaming()  # the sending side is this process: set it up as `dfl-node start` does
    work = Path(tempfile.mkdtemp(prefix="dfl-bench-"))
    bench = bench_model(work, purpose=f"{args.algorithm}.model")
    size = bench.payload_bytes
    with daemon(work, args.algorithm) as agg:
        runs = asyncio.run(measure(bench, agg, args.senders, args.repeat))
    idle = runs["idle"]
    many, one = summary(runs["many"], size, idle), summary(runs["one"], size, idle)
    report = {
        "benchmark": "aggregator", "machine": machine(), "algorithm": args.algorithm, "model_mb": round(size / 1e6, 1),
        "repeat": args.repeat, "senders_run_in": "this process, one gRPC channel each",
        "aggregator_idle_rss_mb": round(idle / 1e6, 1),
        "concurrent": many, "single": one,
        "concurrent_vs_single_intake": round(many["intake_mb_s"] / one["intake_mb_s"], 2),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
