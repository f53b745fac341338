"""A benchmark's child process (``dfl-node simulate`` and the like), timed as the benchmarks report it: wall and CPU
seconds and peak RSS; a child that fails ends the benchmark with its command and the tail of its stderr."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Timed:
    wall_s: float
    cpu_s: float
    peak_rss_mb: int


def run_timed(command: list[str], env: dict[str, str]) -> Timed:
    """Run ``command`` to its end (stdout discarded; stderr kept in a file, so a chatty child never blocks on a
    full pipe) and time it."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        if status != 0:
            err.seek(0)
            raise SystemExit(f"error: {' '.join(command)} failed:\n{err.read()[-4000:]}")
    return Timed(round(wall, 1), round(usage.ru_utime + usage.ru_stime, 1), round(usage.ru_maxrss / 1024))
