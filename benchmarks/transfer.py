"""Model transfer throughput: a ~100 MB model pushed to a real receiving daemon, against two baselines.

* ``stream``: the daemon's own client (:class:`PeerClient.push`) → a real ``dfl-node start`` process
  over loopback: 1 MiB chunks after a validated header, copied into a (reused) receive buffer and
  sha256-checked by the receiver, which answers once the model is validated and handed to its
  fusion (FullAvg's in-place average); it fuses and checkpoints after answering, and the next push
  waits until it is idle again. The sender's sha256 pass (``prepare``) is timed apart, as the
  daemon does it once per message in its worker thread; ``stream_with_prepare`` includes it.
* ``raw_tcp``: the same bytes through a plain socket to a process that only ``recv_into``s them.
* ``unary_grpc``: the same bytes as one unary gRPC message (how most DFL frameworks send models).
* ``bare_grpc_stream`` and ``bare_grpc_stream_sha256``: the ceiling of any asyncio gRPC stream here:
  the same bytes as 1 MiB messages to a process that only counts them, or that also sha256-hashes
  them in a worker thread as a node must before it accepts a model. No header, no copy, no checks.

Both ends of every path share this machine's cores, as loopback tests must.

Also the receiving daemon's peak-RSS increase during the pushes (VmHWM, reset before measuring).
Prints one JSON object; ratios come from the same run. Linux only (``/proc``); run as root to reset
the receiver's VmHWM (otherwise the peak includes its start-up).

    python benchmarks/transfer.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
from _daemon import (  # benchmarks/_daemon.py
    RECEIVER_ID,
    bench_model,
    daemon,
    reset_peak,
    vm,
    wait_idle,
)

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.net.allocator import tune_for_streaming
from dfl_node.net.codec import CHUNK_SIZE, prepare
from dfl_node.net.transport import PeerClient
from dfl_node.net.wire import WireIdentity
from dfl_node.peering.messages import Assignment
from dfl_node.testbed.launcher import free_port

RAW_TCP_SINK = textwrap.dedent("""
    import socket, sys
    port, size = int(sys.argv[1]), int(sys.argv[2])
    srv = socket.create_server(("127.0.0.1", port)); print("ready", flush=True)
    buf = bytearray(size); view = memoryview(buf)
    while True:
        conn, _ = srv.accept()
        got = 0
        while got < size:
            got += conn.recv_into(view[got:], size - got)
        conn.sendall(b"k"); conn.close()
""")

UNARY_SINK = textwrap.dedent("""
    import sys, grpc
    from concurrent import futures
    port = int(sys.argv[1])
    handler = grpc.method_handlers_generic_handler("bench.Sink", {
        "Put": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok")})
    server = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.max_receive_message_length", 1 << 30)])
    server.add_generic_rpc_handlers((handler,)); server.add_insecure_port(f"127.0.0.1:{port}"); server.start()
    print("ready", flush=True); server.wait_for_termination()
""")


BARE_STREAM_SINK = textwrap.dedent("""
    import asyncio, hashlib, sys, grpc
    from concurrent.futures import ThreadPoolExecutor
    from dfl_node.net.allocator import tune_for_streaming
    port, hashing = int(sys.argv[1]), sys.argv[2] == "sha256"
    tune_for_streaming()  # as the daemon does
    hasher = ThreadPoolExecutor(1)

    async def put(requests, context):
        digest, last = hashlib.sha256(), None
        async for chunk in requests:
            if hashing:
                last = hasher.submit(digest.update, chunk)
        if last is not None:
            last.result()
        return b"ok"

    async def main():
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 2 << 20)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Sink", {
            "Put": grpc.stream_unary_rpc_method_handler(put)}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())
""")


@contextlib.contextmanager
def _sink(script: str, *args: str) -> Iterator[int]:
    """Run a receiving script (``argv[1]`` is its port, then ``args``) until the block ends; yields the port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", script, str(port), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield port
    finally:
        proc.kill()
        proc.wait()


def measure_raw_tcp(payload: bytes, repeat: int) -> list[float]:
    with _sink(RAW_TCP_SINK, str(len(payload))) as port:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(payload)
                assert s.recv(1) == b"k"
            times.append(time.perf_counter() - start)
        return times


def measure_unary(payload: bytes, repeat: int) -> list[float]:
    with _sink(UNARY_SINK) as port, grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 1 << 30)]
    ) as channel:
        put = channel.unary_unary("/bench.Sink/Put")
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            assert put(payload, timeout=120) == b"ok"
            times.append(time.perf_counter() - start)
        return times


async def measure_bare_stream(payload: bytes, repeat: int, hashing: bool) -> list[float]:
    with _sink(BARE_STREAM_SINK, "sha256" if hashing else "count") as port:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            put = channel.stream_unary("/bench.Sink/Put")
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                call = put(timeout=120)
                for offset in range(0, len(payload), CHUNK_SIZE):
                    await call.write(payload[offset : offset + CHUNK_SIZE])
                await call.done_writing()
                assert await call == b"ok"
                times.append(time.perf_counter() - start)
            return times


async def measure_stream(message: ModelMessage, wire: WireIdentity, address: str, status_url: str,
                         pid: int, repeat: int) -> tuple[list[float], list[float], int, int]:
    client = PeerClient(address, wire)
    async with httpx.AsyncClient(trust_env=False) as http:
        async def idle() -> None:  # the receiver settles (checkpoints) each fusion before the next push
            await wait_idle(http, status_url)

        # the daemon is up (it has no peers: it only receives)
        await asyncio.wait_for(client.channel.channel_ready(), 120)
        rss_before = vm(pid, "VmRSS")
        reset_peak(pid)  # reset the receiver's peak to its current RSS
        times, prepare_times = [], []
        for round_ in range(repeat):
            await idle()
            # protocol v2: the receiver takes a transfer only as the aggregator of a group naming its sender
            ack = await client.assign(Assignment(role="aggregator", round=round_, aggregator=RECEIVER_ID,
                                                 senders=(message.sender,), deadline_s=300), timeout=60)
            assert ack.ok, ack
            start = time.perf_counter()
            outgoing = prepare(dataclasses.replace(message, round=round_), swarm=wire.swarm,
                               fingerprint=wire.fingerprint)  # the daemon does this in its worker thread
            prepared = time.perf_counter()  # right after training, once per message
            await client.send(outgoing, timeout=300)
            times.append(time.perf_counter() - prepared)
            prepare_times.append(prepared - start)
        await idle()
    await client.close()
    return times, prepare_times, rss_before, vm(pid, "VmHWM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    tune_for_streaming()  # the sending side is this process: set it up as `dfl-node start` does
    work = Path(tempfile.mkdtemp(prefix="dfl-bench-"))
    bench = bench_model(work, purpose="fullavg.model")
    message, wire = bench.message, bench.wire
    payload = b"".join(p.values.numpy().tobytes() for p in message.parts)
    size_mb = len(payload) / 1e6

    with daemon(work, "fullavg") as receiver:
        stream, prepare_times, rss_before, peak = asyncio.run(measure_stream(
            message, wire, receiver.address, receiver.status_url, receiver.pid, args.repeat))
    raw = measure_raw_tcp(payload, args.repeat)
    unary = measure_unary(payload, args.repeat)
    bare = asyncio.run(measure_bare_stream(payload, args.repeat, hashing=False))
    bare_sha256 = asyncio.run(measure_bare_stream(payload, args.repeat, hashing=True))

    def mbps(times: list[float]) -> float:
        return round(size_mb / statistics.median(times), 1)

    report = {
        "benchmark": "transfer", "model_mb": round(size_mb, 1), "repeat": args.repeat,
        "stream_mb_s": mbps(stream), "raw_tcp_mb_s": mbps(raw), "unary_grpc_mb_s": mbps(unary),
        "prepare_sha256_s": round(statistics.median(prepare_times), 3),
        "stream_with_prepare_mb_s": mbps([a + b for a, b in zip(stream, prepare_times)]),
        "stream_vs_raw_tcp": round(mbps(stream) / mbps(raw), 2),
        "stream_vs_unary": round(mbps(stream) / mbps(unary), 2),
        "bare_grpc_stream_mb_s": mbps(bare), "bare_grpc_stream_sha256_mb_s": mbps(bare_sha256),
        "bare_sha256_vs_unary": round(mbps(bare_sha256) / mbps(unary), 2),
        "receiver_rss_before_mb": round(rss_before / 1e6, 1), "receiver_peak_rss_mb": round(peak / 1e6, 1),
        "receiver_peak_increase_x_model": round((peak - rss_before) / len(payload), 2),
        "times_s": {"stream": [round(t, 3) for t in stream], "prepare": [round(t, 3) for t in prepare_times],
                    "raw_tcp": [round(t, 3) for t in raw],
                    "unary_grpc": [round(t, 3) for t in unary], "bare_grpc_stream": [round(t, 3) for t in bare],
                    "bare_grpc_stream_sha256": [round(t, 3) for t in bare_sha256]},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
