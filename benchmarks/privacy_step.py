"""What differential privacy costs a training step on a CPU (the target: at most 2.5× a plain step): local training of
000's MNIST MLP (784-200-200-10) and its CNN at batch 200, plain (:func:`~dfl_node.learning.training.local_sgd`) and
with DP-SGD (the same call with a node's :class:`~dfl_node.learning.privacy.PrivateTraining`: Poisson batches of
expected size 200, per-sample clipping, noise, the account).

One torch thread, as a node runs. The two take turns, ``--repeats`` times each, so a noisy machine slows both alike;
a step's time is the CPU time of the process (``time.process_time``: what another process on the core does not
add) over an update of ``--steps`` steps, and the ratio is that of the medians. The data is random, of MNIST's
shapes: a step's cost does not depend on the values. Prints one JSON object.

    python benchmarks/privacy_step.py [--steps 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.privacy import PrivateTraining
from dfl_node.learning.training import SgdParams, local_sgd

BATCH = 200
LIMIT = 2.5  # the bound on a DP step over a plain one


def seconds_per_step(model: torch.nn.Module, data: ArrayDataset, params: SgdParams,
                     privacy: PrivateTraining | None) -> float:
    steps = len(data) // params.batch_size * params.epochs
    started = time.process_time()
    local_sgd(model, data, params, torch.Generator().manual_seed(0), privacy=privacy)
    return (time.process_time() - started) / steps


def measure(name: str, steps: int, repeats: int) -> dict[str, float]:
    samples = steps * BATCH
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.rand(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g),
                        10)
    model = ModelSpec(name, None).build((1, 28, 28), 10, seed=0)
    params = SgdParams(lr=0.01, momentum=0.5, batch_size=BATCH, epochs=1)
    settings = SharedSettings(batch_size=BATCH, dp_noise=1.0, dp_clip=1.0)
    PrivateTraining.check_model(model, name)
    private = PrivateTraining(settings, name, samples)
    plain, dp = [], []
    seconds_per_step(model, data, params, None)  # warm-up: allocator, kernels, the first import of opacus
    seconds_per_step(model, data, params, private)
    for _ in range(repeats):
        plain.append(seconds_per_step(model, data, params, None))
        dp.append(seconds_per_step(model, data, params, private))
    plain_s, dp_s = statistics.median(plain), statistics.median(dp)
    return {"plain_ms": round(1e3 * plain_s, 2), "dp_ms": round(1e3 * dp_s, 2), "ratio": round(dp_s / plain_s, 3),
            "within_limit": dp_s / plain_s <= LIMIT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="steps of an update (each of batch 200)")
    parser.add_argument("--repeats", type=int, default=5, help="updates of each kind, taking turns")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = {"mnist-mlp": measure("mlp", args.steps, args.repeats), "mnist-cnn": measure("cnn", args.steps,
                                                                                         args.repeats)}
    print(json.dumps({"benchmark": "privacy_step", "batch_size": BATCH, "torch_threads": 1, "limit": LIMIT,
                      "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                      "cases": cases}, indent=2))


if __name__ == "__main__":
    main()
