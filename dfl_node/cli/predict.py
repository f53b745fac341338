"""``dfl-node predict [FILE] [--url URL] [--json]``: a running node's answers for the samples of a CSV, NPZ or JSON
file (or stdin), from its ``POST /predict``: classes, a regressor's values, or an anomaly detector's scores and flags
(the node's task, as ``GET /model/info`` says).

Light on purpose, as ``status`` is: numpy and httpx, no torch, so an application's shell script on a small
device pays for its HTTP requests only. The samples are read and checked here (numbers, finite, one shape),
reshaped to the node's sample shape when a row holds as many values (a CSV row is flat), and sent in batches
the node accepts (``GET /model/info`` says how many and how large).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import click
import httpx
import numpy as np

from dfl_node.api.client import rest_client
from dfl_node.api.status_cli import DEFAULT_URL
from dfl_node.cli.http_token import http_headers, http_token_option
from dfl_node.errors import OperatorError
from dfl_node.learning.csv_reader import read_features
from dfl_node.records.urls import normalize_url

TIMEOUT_S = 60.0  # a batch of 1,024 samples on a slow device, with room


def read_input(source: str, fmt: str | None, label_column: str) -> np.ndarray:
    """The samples of ``source`` (a path, or ``-`` for stdin) as float32 ``(N, *shape)``; ``fmt`` None: from the
    suffix, or for stdin JSON if it starts with ``{`` or ``[``, else CSV. Problems are ValueErrors."""
    data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    if fmt is None:
        suffix = Path(source).suffix.lower().lstrip(".")
        fmt = suffix if suffix in ("csv", "npz", "json") else "json" if data.lstrip()[:1] in (b"{", b"[") else "csv"
    if fmt == "npz":
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            if "x" not in arrays:
                raise ValueError(f"holds no array 'x' (it has {', '.join(arrays.files) or 'none'})")
            samples = arrays["x"]
        if samples.dtype.kind not in "iuf":
            raise ValueError(f"'x' holds {samples.dtype}, not numbers")
    elif fmt == "json":
        loaded = json.loads(data)
        listed = loaded.get("samples") if isinstance(loaded, dict) else loaded
        if not isinstance(listed, list):
            raise ValueError('expected {"samples": [...]} or a list of samples')
        samples = np.asarray(listed, dtype=np.float32)
    else:
        samples = read_features(io.BytesIO(data), "stdin" if source == "-" else source, label_column)
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim < 2 or len(samples) == 0:
        raise ValueError("holds no samples")
    bad = np.argwhere(~np.isfinite(samples))
    if len(bad):
        raise ValueError(f"sample {int(bad[0][0])} holds a value that is not a finite float32 number")
    return samples


def _node(client: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
    """The JSON of a request to the node: unreachable or refusing, an :class:`OperatorError`, with the node's
    own one line where it gave one."""
    try:
        reply = client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise OperatorError(f"cannot reach {url}: {exc or type(exc).__name__}") from None
    if reply.status_code != 200:
        try:
            detail = reply.json().get("detail", reply.text)
        except ValueError:
            detail = reply.text[:200]
        raise OperatorError(f"{url} answered HTTP {reply.status_code}: {detail}")
    return reply.json()


def _batches(samples: np.ndarray, most: int, max_bytes: int) -> list[bytes]:
    """Request bodies of at most ``most`` samples and ``max_bytes`` bytes each."""
    bodies, start, size = [], 0, most
    while start < len(samples):
        body = json.dumps({"samples": samples[start : start + size].tolist()}).encode()
        if len(body) > max_bytes and size > 1:
            size //= 2
            continue
        bodies.append(body)
        start += size
    return bodies


@click.command()
@click.argument("file", default="-")
@click.option("--url", default=DEFAULT_URL, show_default=True, help="The node's REST API.")
@click.option("--format", "fmt", type=click.Choice(["csv", "npz", "json"]), default=None,
              help="How FILE is written  [default: its suffix; stdin: JSON if it starts with { or [, else CSV]")
@click.option("--label-column", default="label", show_default=True,
              help="CSV with a header: the column left out (a training file's label).")
@click.option("--json", "as_json", is_flag=True, help='One JSON document: {"predictions": [...]} (each {"class", '
                                                      '"probability", "probabilities"}; regression: {"values"}; '
                                                      'anomaly: {"score", "flag"}), and the model that answered.')
@http_token_option
def predict(file: str, url: str, fmt: str | None, label_column: str, as_json: bool,
            http_token_file: Path | None) -> None:
    """Ask a running node for the classes of samples (or what its task answers instead): those of FILE (default:
    stdin), one line each: the class and its probability; a regressor's values; an anomaly detector's score and
    "anomaly" or "normal". FILE is a CSV (one sample a row, an optional header), an NPZ (array x) or JSON
    ({"samples": [...]} or a list); each sample has the node's sample shape, or as many values."""
    try:
        samples = read_input(file, fmt, label_column)
    except (OSError, ValueError) as exc:  # InputError, the CSV reader's, is a ValueError
        raise click.BadParameter(str(exc), param_hint="FILE") from None
    base = normalize_url(url)
    with rest_client(TIMEOUT_S, http_headers(http_token_file)) as client:
        info = _node(client, "GET", f"{base}/model/info")
        shape = tuple(info["sample_shape"])
        if samples.shape[1:] != shape:
            if int(np.prod(samples.shape[1:])) != int(np.prod(shape)):
                raise click.BadParameter(f"its samples have shape {list(samples.shape[1:])}; the node's model takes "
                                         f"{list(shape)}", param_hint="FILE")
            samples = samples.reshape(len(samples), *shape)
        replies = [_node(client, "POST", f"{base}/predict", content=body,
                         headers={"content-type": "application/json"})
                   for body in _batches(samples, int(info["max_batch"]), int(info["max_body_bytes"]))]
    first, last = replies[0], replies[-1]
    if first["sha256"] != last["sha256"]:  # the node committed a new model between two batches
        click.echo(f"warning: the node's model changed while it answered (round {first['round']} to "
                   f"{last['round']}): the first samples' answers are the older model's", err=True)
    answers = [answer for reply in replies for answer in reply["predictions"]]
    if as_json:
        click.echo(json.dumps({"node": last["node"], "round": last["round"], "sha256": last["sha256"],
                               "predictions": answers}))
        return
    for answer in answers:
        click.echo(_line(answer))


def _line(answer: dict[str, Any]) -> str:
    """One sample's answer in a line: ``3 0.9712`` (class, probability), ``0.4123 1.5`` (values), ``0.0031 normal``
    (anomaly score, flag)."""
    if "class" in answer:
        return f"{answer['class']} {answer['probability']:.4f}"
    if "score" in answer:
        return f"{answer['score']:.4g} {'anomaly' if answer['flag'] else 'normal'}"
    return " ".join(f"{value:.6g}" for value in answer["values"])
