"""Reading a user's CSV into a node's dataset: a file of 1,000,000 rows × 32 columns (31 features and the label;
a header, 6 significant digits) made in a temporary folder, read by each reader in a fresh process. For each: wall
seconds (median of ``--repeat`` runs), and the peak memory the read added (VmHWM after it − VmRSS before it, the
peak reset before: Linux, as root), against the float32 array of the table (128 MB for the default size).

* ``node``: what ``dfl-node start --data FILE`` does: :class:`~dfl_node.learning.local_data.LocalData` reads the
  file and splits it into the node's training and validation tensors (the hold-out).
* ``read_csv``: dfl-node's reader alone (:func:`~dfl_node.learning.csv_reader.read_csv`: features float32, labels
  int64).
* ``numpy_loadtxt``: ``np.loadtxt(path, dtype=np.float32, delimiter=",", skiprows=1)``.
* ``pandas_float32``: ``pd.read_csv(path, dtype=np.float32).to_numpy()`` (its C engine), where pandas is
  installed (it is not a dependency of dfl-node); ``pandas_default``: ``pd.read_csv(path).to_numpy()`` (float64,
  as most code calls it); ``pandas_pyarrow``: ``engine="pyarrow"``, where pyarrow is installed.

Prints one JSON object; ratios come from the same run: ``node_vs_pandas_float32`` (seconds; the target is ≤ 1) and
``node_peak_vs_array`` (the target is ≤ 2).

    python benchmarks/read_csv.py [--rows 1000000] [--columns 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

READERS = {
    "node": ("from dfl_node.learning.data_format import DataFormat\n"
             "from dfl_node.learning.local_data import LocalData",
             "v = LocalData(path, DataFormat(), val_fraction=0.2, max_samples=0, seed=0).load(); "
             "rows = len(v.train) + len(v.val)"),
    "read_csv": ("from dfl_node.learning.csv_reader import read_csv", "t = read_csv(path); rows = len(t.y)"),
    "numpy_loadtxt": ("", "a = np.loadtxt(path, dtype=np.float32, delimiter=',', skiprows=1); rows = len(a)"),
    "pandas_float32": ("import pandas as pd", "a = pd.read_csv(path, dtype=np.float32).to_numpy(); rows = len(a)"),
    "pandas_default": ("import pandas as pd", "a = pd.read_csv(path).to_numpy(); rows = len(a)"),
    "pandas_pyarrow": ("import pandas as pd",
                       "a = pd.read_csv(path, dtype=np.float32, engine='pyarrow').to_numpy(); rows = len(a)"),
}
NEEDS = {"pandas_float32": "pandas", "pandas_default": "pandas", "pandas_pyarrow": "pyarrow"}

CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
import numpy as np
{imports}

def vm(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

path = Path(sys.argv[1])
try:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (root only)
    reset = True
except OSError:
    reset = False
before = vm("VmRSS")
started = time.perf_counter()
{read}
seconds = time.perf_counter() - started
print(json.dumps({{"seconds": seconds, "peak_added": vm("VmHWM") - before, "rows": rows, "peak_reset": reset}}))
"""


def write_table(path: Path, rows: int, columns: int, seed: int = 0) -> None:
    """``columns - 1`` features (standard normal, 6 significant digits) and an integer label 0..9, in blocks."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        f.write(",".join([f"f{i}" for i in range(columns - 1)] + ["label"]) + "\n")
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            block = np.column_stack([rng.standard_normal((n, columns - 1)), rng.integers(0, 10, n)])
            np.savetxt(f, block, delimiter=",", fmt=["%.6g"] * (columns - 1) + ["%d"])


def measure(reader: str, path: Path) -> dict:
    imports, read = READERS[reader]
    code = CHILD.format(repo=str(REPO), imports=imports, read=read)
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--columns", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    readers = [r for r in READERS if r not in NEEDS or importlib.util.find_spec(NEEDS[r]) is not None]
    with tempfile.TemporaryDirectory(prefix="dfl-read-csv-") as folder:
        path = Path(folder) / "table.csv"
        started = time.perf_counter()
        write_table(path, args.rows, args.columns)
        made = time.perf_counter() - started
        runs: dict[str, list[dict]] = {reader: [] for reader in readers}
        for _ in range(args.repeat):  # interleaved: a machine that slows down slows every reader alike
            for reader in readers:
                runs[reader].append(measure(reader, path))
        size = path.stat().st_size
    array = args.rows * args.columns * 4
    results = {reader: {"seconds": round(statistics.median(r["seconds"] for r in done), 3),
                        "peak_added_mb": round(max(r["peak_added"] for r in done) / 1e6, 1),
                        "peak_vs_array": round(max(r["peak_added"] for r in done) / array, 2),
                        "rows": done[0]["rows"]}
               for reader, done in runs.items()}
    report = {"rows": args.rows, "columns": args.columns, "file_mb": round(size / 1e6, 1),
              "array_float32_mb": round(array / 1e6, 1), "made_in_s": round(made, 1), "repeat": args.repeat,
              "peak_reset": all(r["peak_reset"] for done in runs.values() for r in done), "readers": results,
              "node_peak_vs_array": results["node"]["peak_vs_array"]}
    for other in ("numpy_loadtxt", "pandas_float32", "pandas_default", "pandas_pyarrow"):
        if other in results:
            report[f"node_vs_{other}"] = round(results["node"]["seconds"] / results[other]["seconds"], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
