"""Helpers shared by the benchmarks that talk to a real ``dfl-node start`` daemon (transfer, aggregator).

* :func:`bench_model`: the ~100.5 MB MLP (:data:`HIDDEN` on 8x8 digits), its wire identity and a
  message carrying it, plus the shards a daemon of that architecture reads.
* :func:`daemon`: a receiving daemon (round mode, no peers, no mDNS, no evaluation) for a block.
* :func:`vm`, :func:`reset_peak`, :class:`RssSampler`: a process's RSS and its peak, from ``/proc``.
* :func:`wait_idle`: until the daemon's REST status says it holds no role.

Linux only (``/proc``); resetting a peak (``clear_refs``) needs root. Importing this module puts the
repository this file is in first on ``sys.path`` (and on the daemons' ``PYTHONPATH``), so that a
benchmark and its daemons measure this tree, whichever ``dfl_node`` the environment has installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))

import httpx  # after the path above, as every import of dfl_node below
import torch

from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import ModelSpec, build_model, fingerprint
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.net.manifest import Limits, manifest_of
from dfl_node.net.wire import WireIdentity
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.testbed.launcher import free_port

HIDDEN = [5000, 4950]  # an MLP on 8x8 digits with ~25.1 M float32 parameters ≈ 100.5 MB
SWARM = "bench"
RECEIVER_ID = "node-1"


@dataclass(frozen=True)
class BenchModel:
    spec: str  # the architecture spec string, e.g. "mlp:5000,4950"
    state: dict[str, torch.Tensor]
    wire: WireIdentity
    message: ModelMessage
    payload_bytes: int
    shards: Path  # the folder of the daemon's data (<shards>/node-1)


def bench_model(work: Path, purpose: str, sender: str = "bench-sender", num_samples: int = 100) -> BenchModel:
    """Write the shards of a 2-node digits fleet under ``work`` and build the benchmark's model and message."""
    config = ExperimentConfig(nodes=2, hidden=HIDDEN, seed=0)
    fleet = provision(config)
    write_fleet(fleet, work / "shards")
    model = build_model("mlp", fleet.input_shape, fleet.num_classes, hidden=HIDDEN, seed=1)
    state = model.state_dict()
    spec = str(ModelSpec("mlp", tuple(HIDDEN)))
    wire = WireIdentity(SWARM, spec, fingerprint("mlp", state), manifest_of(state), Limits())
    message = ModelMessage(sender=sender, round=0, purpose=purpose, num_samples=num_samples,
                           parts=parts_from_state(state), model=spec)
    return BenchModel(spec, state, wire, message, message.nbytes, work / "shards")


@dataclass(frozen=True)
class Daemon:
    process: subprocess.Popen
    address: str  # host:port of its gRPC server
    status_url: str  # its REST /status

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def daemon(work: Path, algorithm: str, *, node_id: str = RECEIVER_ID, env: dict[str, str] | None = None
           ) -> Iterator[Daemon]:
    """A ``dfl-node start`` receiving daemon of :data:`HIDDEN` (no peers, no mDNS, no evaluation) until the block
    ends."""
    grpc_port, http_port = free_port(), free_port()
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    environ = {**os.environ, "PYTHONPATH": path, "DFL_HIDDEN": ",".join(map(str, HIDDEN)), "DFL_SEED": "0",
               **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "dfl_node", "--log-level", "WARNING", "start", "--id", node_id,
         "--data", str(work / "shards" / node_id), "--algorithm", algorithm, "--swarm", SWARM, "--no-mdns",
         "--no-evaluate", "--grpc-port", str(grpc_port), "--http-port", str(http_port),
         "--state-dir", str(work / "state" / node_id)], env=environ)
    try:
        yield Daemon(process, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}/status")
    finally:
        process.terminate()
        process.wait(30)


async def wait_idle(http: httpx.AsyncClient, status_url: str) -> dict:
    """Until the daemon holds no role (it settled its last fusion and checkpoint); returns its status."""
    while (status := (await http.get(status_url)).json())["role"] != "idle":
        await asyncio.sleep(0.05)
    return status


def vm(pid: int, key: str) -> int:
    """``key`` (VmRSS, VmHWM, …) of ``/proc/<pid>/status``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its current RSS; False where that is not allowed (not root)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Polls a process's VmRSS every ``interval`` seconds in a thread; :meth:`mark` starts a new window
    and returns the peak of the one before, so one sampler can measure several phases."""

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        self.pid, self.interval = pid, interval
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = vm(self.pid, "VmRSS")
            except (OSError, KeyError):
                return
            with self._lock:
                self._peak = max(self._peak, rss)
            time.sleep(self.interval)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mark(self) -> int:
        """The peak VmRSS since the last mark (or the start); a new window begins at the current RSS."""
        current = vm(self.pid, "VmRSS")
        with self._lock:
            peak, self._peak = max(self._peak, current), current
        return peak
