"""atheris (coverage-guided, libFuzzer) against the Transfer codec, next to the hypothesis suite.

The target is ``tests/fuzz_codec_atheris.py``: frames fed to a real :class:`MessageAssembler`, valid
transfers as the seed corpus, the header's checksum optionally fixed up so mutations reach the
manifest and tensor building. libFuzzer exits non-zero on the first crash (any exception but a
rejection, or an accepted message that does not fit the model) and writes the input that caused it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris has wheels for Linux x86-64 only")  # a failure in CI (conftest)

ROOT = Path(__file__).resolve().parents[1]
RUNS = 40_000  # coverage grows within the first few thousand; CI time is the limit


def test_the_codec_survives_coverage_guided_fuzzing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    target = [sys.executable, "-m", "tests.fuzz_codec_atheris"]
    subprocess.run([*target, "--seed-corpus", str(corpus)], cwd=ROOT, check=True, timeout=120)
    seeds = len(list(corpus.iterdir()))
    run = subprocess.run([*target, str(corpus), f"-runs={RUNS}", "-seed=1", f"-artifact_prefix={tmp_path}/"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert not list(tmp_path.glob("crash-*")), "libFuzzer wrote a crashing input"
    assert f"Done {RUNS} runs" in output
    coverage = [int(c) for c in re.findall(r"cov: (\d+)", output)]
    assert coverage and coverage[-1] > coverage[0], "no new coverage: is dfl_node.net instrumented?"
    grown = len(list(corpus.iterdir()))
    print(f"\natheris: {RUNS} mutated transfers through the codec, 0 crashes; coverage {coverage[0]} → "
          f"{coverage[-1]} edges, corpus {seeds} → {grown} inputs")
