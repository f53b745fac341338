"""dfl_node.net.allocator: the malloc settings apply on this (glibc) machine; what they buy is measured
by benchmarks/transfer.py, not asserted here."""

from __future__ import annotations

import subprocess
import sys


def test_streaming_malloc_settings_apply_in_a_fresh_process() -> None:
    code = "from dfl_node.net.allocator import tune_for_streaming as t; raise SystemExit(0 if t() else 3)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
