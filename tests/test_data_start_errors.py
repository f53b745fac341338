"""Bad data at start: ``dfl-node start`` on each kind of malformed data says one line naming the file
(and the row or sample), exits 2, and starts nothing; a hand-made shard of the wrong shape was a 47-line traceback.

The cases run in one fresh process that calls ``dfl-node``'s console entry point once per case, as the script
would (each ``start`` costs its torch import otherwise: 13 processes, 50 CPU-seconds); a case that were taken would
serve, and the process would not end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.data_files import blobs, write_csv

HEADER = "a,b,label\n"
CASES = ("non-numeric cell", "NaN", "Inf", "column count", "label outside the classes", "empty file", "sample shape",
         "npz without y", "hand-made shard of the wrong shape", "hand-made shard without metadata",
         "files of other shapes", "missing", "test set of other features")


def _csv(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def cases(root: Path) -> dict[str, tuple[list[str], str]]:
    """Each case: the arguments of `dfl-node start` after --id and the state dir, and the one line expected."""
    good = write_csv(root / "good.csv", *blobs(40, 2, 3, seed=1))
    made: dict[str, tuple[list[str], str]] = {}

    def data(name: str, path: Path, problem: str, *extra: str) -> None:
        made[name] = (["--data", str(path), *extra], problem.format(path=path))

    data("non-numeric cell", _csv(root, "cell.csv", HEADER + "1,2,0\n1,abc,1\n"),
         "{path} row 3: column 'b': 'abc' is not a number")
    data("NaN", _csv(root, "nan.csv", HEADER + "1,2,0\nNaN,2,1\n"),
         "{path} row 3: column 'a' is NaN (NaN, infinities and values beyond float32 are not data)")
    data("Inf", _csv(root, "inf.csv", HEADER + "1,inf,0\n"),
         "{path} row 2: column 'b' is inf (NaN, infinities and values beyond float32 are not data)")
    data("column count", _csv(root, "cols.csv", HEADER + "1,2,0\n1,2,3,1\n"),
         "{path} row 3: 4 columns, expected 3 as in its header")
    data("label outside the classes", _csv(root, "label.csv", HEADER + "1,2,0\n1,2,3\n"),
         "{path} row 3: label 3 is not one of the classes (0..2)", "--num-classes", "3")
    data("empty file", _csv(root, "empty.csv", ""), "{path}: empty file (no rows)")
    np.savez(root / "window.npz", x=np.zeros((4, 6, 20)), y=np.arange(4))
    data("sample shape", root / "window.npz",
         "{path}: a sample holds 120 values (6, 20); --sample-shape 5,20 needs 100", "--sample-shape", "5,20")
    np.savez(root / "nolabels.npz", x=np.zeros((4, 6)))
    data("npz without y", root / "nolabels.npz",
         "{path}: an .npz file needs arrays x and y (np.savez(path, x=..., y=...)), it holds x")
    shard = root / "shard"
    shard.mkdir()
    save_file({"x": torch.zeros(216), "y": torch.zeros(216, dtype=torch.int64)}, str(shard / "train.safetensors"),
              metadata={"num_classes": "3"})
    data("hand-made shard of the wrong shape", shard,
         f"{shard / 'train.safetensors'}: 'x' must be float32 (N, *sample shape), got torch.float32 (216,)")
    save_file({"x": torch.zeros(216, 6), "y": torch.zeros(216, dtype=torch.int64)}, str(root / "nometa.safetensors"))
    data("hand-made shard without metadata", root / "nometa.safetensors",
         "{path}: metadata 'num_classes' missing or not an integer")
    mixed = root / "mixed"
    mixed.mkdir()
    write_csv(mixed / "a.csv", *blobs(20, 2, 3, seed=2))
    write_csv(mixed / "b.csv", *blobs(20, 3, 3, seed=3))
    data("files of other shapes", mixed, f"{mixed / 'b.csv'}: samples of shape (3,), this node's data has (2,)")
    data("missing", root / "none", "--data {path}: no such file or folder")
    other = write_csv(root / "test.csv", *blobs(10, 5, 3, seed=4))
    made["test set of other features"] = (["--data", str(good), "--test-data", str(other)],
                                          f"{other}: samples of shape (5,), this node's data has (2,)")
    assert tuple(made) == CASES
    return made


RUN = """
import contextlib, io, json, sys
from dfl_node.cli import cli
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli(argv, prog_name="dfl-node")
            code = 0
        except SystemExit as exc:
            code = exc.code
    results[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list, str]]:
    """Each case's exit code, stdout and stderr, and the line it should say."""
    root = tmp_path_factory.mktemp("bad-data")
    made = cases(root)
    argv = {name: ["start", "--id", f"n{i}", "--state-dir", str(root / f"state{i}"), "--http-port", "0", "--no-mdns",
                   *args] for i, (name, (args, _)) in enumerate(made.items())}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(argv)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    return {name: (results[name], expected) for name, (_, expected) in made.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_bad_data_at_start_is_one_line_and_exit_2(started: dict, case: str) -> None:
    (code, out, err), expected = started[case]
    assert (code, out, err.splitlines()) == (2, "", [f"error: {expected}"]), err
