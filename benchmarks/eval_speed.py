"""Evaluation speed: K same-architecture models on one test set, batched (evaluate_many) vs the loop.

Prints one JSON object. Both timings come from the same run on one torch thread, so their ratio
survives a noisy machine; absolute figures do not. The loop (``training.evaluate`` per model) takes
~7 s per 000 CNN on the 10k Fashion-MNIST test images here, so by default it is timed on the first
``--loop-models`` models and scaled to K (``loop_s_for_all`` says whether it was measured or scaled);
``--loop-models K`` times the whole loop. The timed models' results are compared with the batched ones.

    DFL_DATA_DIR=../shared/datasets python benchmarks/eval_speed.py [--models 50] [--loop-models 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from dfl_node.learning.datasets import load_dataset
from dfl_node.learning.evaluation import DEFAULT_MEMORY_BUDGET, evaluate_many
from dfl_node.learning.models import build_model
from dfl_node.learning.training import evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=50, help="K: models evaluated (seeds 0…K-1)")
    parser.add_argument("--loop-models", type=int, default=10, help="models the loop is timed on (scaled to K)")
    parser.add_argument("--model", default="cnn", help="registry architecture (000's CNN by default)")
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--memory-budget-mib", type=int, default=DEFAULT_MEMORY_BUDGET // 2**20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, test = load_dataset(args.dataset)
    models = [build_model(args.model, test.input_shape, test.num_classes, seed=s) for s in range(args.models)]
    timed = min(args.loop_models, args.models)

    start = time.perf_counter()
    batched = evaluate_many(models, test, memory_budget=args.memory_budget_mib * 2**20)
    batched_s = time.perf_counter() - start
    start = time.perf_counter()
    loop = [evaluate(m, test) for m in models[:timed]]
    loop_timed_s = time.perf_counter() - start
    loop_s = loop_timed_s * args.models / timed

    report = {
        "benchmark": "eval_speed", "model": args.model, "dataset": args.dataset, "test_samples": len(test),
        "models": args.models, "parameters_per_model": sum(p.numel() for p in models[0].parameters()),
        "memory_budget_mib": args.memory_budget_mib,
        "batched_s": round(batched_s, 2), "batched_s_per_model": round(batched_s / args.models, 3),
        "loop_models_timed": timed, "loop_timed_s": round(loop_timed_s, 2),
        "loop_s_per_model": round(loop_timed_s / timed, 3),
        "loop_s_for_all": round(loop_s, 2) if timed == args.models else f"{loop_s:.2f} (scaled from {timed} models)",
        "speedup": round(loop_s / batched_s, 2),
        "max_accuracy_diff_samples": max(round(abs(a.accuracy - b.accuracy) * len(test))
                                         for a, b in zip(batched, loop)),
        "max_loss_rel_diff": max(abs(a.loss - b.loss) / abs(b.loss) for a, b in zip(batched, loop)),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
