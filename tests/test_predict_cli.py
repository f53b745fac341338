"""``dfl-node predict``: the classes a running node gives the samples of a CSV, NPZ or JSON file, or stdin.

The node is real and runs in this process (its REST API on a real port); the verb runs as its own process, as a
user's shell runs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dfl_node.learning.datasets import load_shard
from dfl_node.node.node import Node
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import quiet_node_config, running


@contextlib.asynccontextmanager
async def running_node(shards: Path, state: Path) -> AsyncIterator[Node]:
    """A node of the test fleet in this process, its REST API on a free port."""
    async with running(quiet_node_config(shards, state, http_port=free_port())) as node:
        yield node


async def predict(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "dfl_node", "predict", *args, env=env,
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def expected(node: Node, x: torch.Tensor) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        probabilities = torch.softmax(node.learner.ctx.model.eval()(x), 1)
    best, classes = probabilities.max(1)
    return classes.tolist(), best.tolist()


async def test_predict_reads_csv_npz_json_and_stdin(fleet_shards: Path, tmp_path: Path) -> None:
    test = load_shard(fleet_shards / "test.safetensors")
    x = torch.cat([test.x] * 3)  # 1,080 samples: more than one request's 1,024
    flat = x.reshape(len(x), -1).numpy()
    header = ",".join([*(f"pixel{i}" for i in range(64)), "label"])
    rows = [",".join([*map(repr, row.tolist()), str(label)]) for row, label in zip(flat, [*test.y.tolist()] * 3)]
    (tmp_path / "samples.csv").write_text("\n".join([header, *rows]) + "\n")  # a training file: its label is left out
    np.savez(tmp_path / "samples.npz", x=x.numpy())
    async with running_node(fleet_shards, tmp_path / "state") as node:
        url = f"http://127.0.0.1:{node.config.api.http_port}"
        classes, best = expected(node, x)
        status, out, err = await predict(str(tmp_path / "samples.csv"), "--url", url)
        assert status == 0, err
        lines = out.splitlines()
        assert len(lines) == len(x)
        assert [int(line.split()[0]) for line in lines] == classes
        assert [line.split()[1] for line in lines] == [f"{p:.4f}" for p in best]
        status, out, err = await predict(str(tmp_path / "samples.npz"), "--url", url, "--json")
        assert status == 0, err
        answer = json.loads(out)
        assert [p["class"] for p in answer["predictions"]] == classes
        assert (answer["node"], answer["round"], answer["sha256"]) == ("node-0", 0, node.learner.digest)
        status, out, err = await predict("--url", url, stdin=json.dumps({"samples": x[:3].tolist()}).encode())
        assert status == 0, err
        assert [int(line.split()[0]) for line in out.splitlines()] == classes[:3]


@pytest.mark.parametrize(("content", "reason"), [
    ("1,2,3\n4,5,6\n", "its samples have shape [3]; the node's model takes [1, 8, 8]"),
    ("a,b\n", "no rows of data (a header only)"),  # CSV problems as a node's data reader names them
    ("1,2\n\n3,x\n", "row 3: column 2: 'x' is not a number"),
    ("a,b\n1,2\n3,4,5\n", "row 3: 3 columns, expected 2 as in its header"),
    (",".join(["nan"] * 64) + "\n", "row 1: column 1 is nan (NaN, infinities and values beyond float32 are not data)"),
])
async def test_bad_samples_are_one_line_and_exit_2(fleet_shards: Path, tmp_path: Path, content: str,
                                                   reason: str) -> None:
    (tmp_path / "bad.csv").write_text(content)
    async with running_node(fleet_shards, tmp_path / "state") as node:
        status, out, err = await predict(str(tmp_path / "bad.csv"), "--url", f"127.0.0.1:{node.config.api.http_port}")
    assert status == 2 and out == ""
    [line] = [line for line in err.splitlines() if line.startswith("Error:")]
    assert reason in line, err


async def test_a_node_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "one.json").write_text(json.dumps([[1.0, 2.0]]))
    status, out, err = await predict(str(tmp_path / "one.json"), "--url", f"http://127.0.0.1:{free_port()}")
    assert status == 1 and out == ""
    assert err.startswith("error: cannot reach http://127.0.0.1:") and len(err.splitlines()) == 1, err


def test_predict_imports_neither_torch_nor_the_node(tmp_path: Path) -> None:
    """A device's script that asks its node pays for the request, not for torch (as ``status``)."""
    (tmp_path / "one.json").write_text(json.dumps([[1.0, 2.0]]))
    args = ["predict", str(tmp_path / "one.json"), "--url", f"http://127.0.0.1:{free_port()}"]
    code = ("import sys; from dfl_node.cli import cli\n"
            f"try:\n    cli({args!r})\nexcept SystemExit:\n    pass\n"
            "print('imported:', sorted(m for m in ('torch', 'grpc', 'dfl_node.node') if m in sys.modules))")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip().endswith("imported: []"), ran.stdout + ran.stderr
