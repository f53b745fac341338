"""``POST /predict`` latency on a real node over HTTP: one sample, and a batch of 256 (p50 and p99, milliseconds).

A ``dfl-node start`` daemon (1 torch thread, no peers, so nothing else runs in it) serves the digits MLP of
``--hidden`` (default the registry's 200-200); a client sends the same requests one after the other on one
keep-alive connection, as an application on the device would. Beside each figure, in the same run: ``GET /healthz``
(the REST API's floor: an HTTP round trip that does nothing), and the model's forward pass alone in this process
(1 thread), so the ratios say what /predict adds to any request, and what HTTP, JSON and validation add to the
model.

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/predict.py [--requests 300] [--hidden 200,200]'
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from _daemon import daemon  # benchmarks/_daemon.py: this tree first on sys.path

from dfl_node.learning.datasets import load_shard
from dfl_node.learning.models import build_model
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.settings.experiment import ExperimentConfig


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)}


def over_http(client: httpx.Client, url: str, body: bytes | None, requests: int) -> list[float]:
    """Seconds of each of ``requests`` identical requests (after 20 to warm up), answered 200: a POST of ``body``,
    or a GET."""
    timings = []
    for i in range(20 + requests):
        started = time.perf_counter()
        reply = (client.get(url) if body is None else
                 client.post(url, content=body, headers={"content-type": "application/json"}))
        elapsed = time.perf_counter() - started
        reply.raise_for_status()
        if i >= 20:
            timings.append(elapsed)
    return timings


@torch.inference_mode()
def in_process(model: torch.nn.Module, x: torch.Tensor, requests: int) -> list[float]:
    timings = []
    for i in range(20 + requests):
        started = time.perf_counter()
        torch.softmax(model(x), 1)
        if i >= 20:
            timings.append(time.perf_counter() - started)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="timed requests per batch size")
    parser.add_argument("--hidden", default="200,200", help="the MLP's hidden layer widths")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hidden = [int(w) for w in args.hidden.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_fleet(provision(ExperimentConfig(nodes=2, seed=0)), work / "shards")
        test = load_shard(work / "shards" / "test.safetensors")
        model = build_model("mlp", test.input_shape, test.num_classes, hidden=hidden, seed=0).eval()
        result: dict[str, object] = {"model": f"mlp:{args.hidden}", "sample_shape": list(test.input_shape),
                                     "threads": 1, "requests": args.requests}
        with daemon(work, "defkt", env={"DFL_HIDDEN": args.hidden}) as node, httpx.Client(timeout=60) as client:
            base = node.status_url.removesuffix("/status")
            deadline = time.monotonic() + 60
            while True:  # until its REST API answers
                try:
                    info = client.get(f"{base}/model/info").json()
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            result["spec"] = info["spec"]
            floor = percentiles(over_http(client, f"{base}/healthz", None, args.requests))
            result["healthz_http"] = floor
            for batch in (1, 256):
                x = test.x[:batch]
                body = json.dumps({"samples": x.tolist()}).encode()
                http = percentiles(over_http(client, f"{base}/predict", body, args.requests))
                local = percentiles(in_process(model, x, args.requests))
                result[f"batch_{batch}"] = {"body_bytes": len(body), "http": http, "forward_in_process": local,
                                            "http_over_healthz_p50": round(http["p50_ms"] / floor["p50_ms"], 1),
                                            "http_over_forward_p50": round(http["p50_ms"] / local["p50_ms"], 1)}
            metrics = client.get(f"{base}/metrics").text
            result["node_counted"] = [line for line in metrics.splitlines()
                                      if line.startswith(("dfl_predict_requests_total", "dfl_predicted_samples_total"))]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
