"""The trained model put to use over REST: ``GET /model``, ``GET /model/info`` and ``POST /predict``.

All three read the node's *committed* model (:class:`~dfl_node.node.model.served.ServedModel`): the one its newest
checkpoint holds, never one a role is changing, so an answer is that of one whole model, named by its digest.

``POST /predict`` takes JSON ``{"samples": [...]}``: 1 to :data:`MAX_BATCH` samples, each a nested list of the
node's sample shape, of finite numbers. It answers per sample what the node's task makes of it (the task is the
model card's, as ``/model/info`` says): a classifier the class, its probability and every class's; an anomaly
detector the sample's score (its reconstruction error) and whether it is flagged (the score exceeds the card's
threshold); a regressor, or a plugin's task, the model's values.

A request is hostile input: its body is read up to :data:`MAX_BODY` bytes (more is 413, unread), it is validated
in one pass that stops at the first problem (422, one line that names where), and nothing of the node changes
either way — the model, its counters, its state. Validation and inference run in a worker thread (with the node's
torch threads), so the node keeps answering its peers, and at most :data:`CONCURRENT` requests are worked on at
once, so memory stays bounded however many clients call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Annotated, Any

import numpy as np
import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from dfl_node.api.schemas import Detection, Estimate, ModelInfo, Prediction, Predictions
from dfl_node.learning.export import ANOMALY, CLASSIFICATION, TrainedModel, answers
from dfl_node.records.metrics import NodeMetrics

__all__ = ["MAX_BATCH", "MAX_BODY", "add_model_routes"]

log = logging.getLogger(__name__)

MAX_BATCH = 1024  # samples a request may hold
MAX_BODY = 32 * 2**20  # bytes: 1,024 samples of 784 float32 values as JSON take 16 MB
CONCURRENT = 2  # requests validated and answered at once; the others wait their turn

_Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]  # no strings, booleans, nulls, NaN or ±inf


class InvalidSamples(ValueError):
    """A /predict body that is not a batch of this model's samples (422); the message is one line."""


@lru_cache(maxsize=8)
def _request_type(sample_shape: tuple[int, ...]) -> TypeAdapter[Any]:
    """The validator of a request for samples of ``sample_shape``: exact lengths at every level, finite numbers,
    no other keys, and the first problem ends it (``fail_fast``: a body of a million bad values costs one)."""
    sample: Any = _Number
    for size in reversed(sample_shape):
        sample = Annotated[list[sample], Field(min_length=size, max_length=size, fail_fast=True)]

    class Request(BaseModel):
        model_config = ConfigDict(extra="forbid")
        samples: Annotated[list[sample], Field(min_length=1, max_length=MAX_BATCH, fail_fast=True)]

    return TypeAdapter(Request)


def _where(location: tuple[int | str, ...]) -> str:
    """``('samples', 3, 0, 17)`` as ``samples[3][0][17]``."""
    head, *indices = location or ("body",)
    return f"{head}" + "".join(f"[{i}]" for i in indices)


def read_samples(body: bytes, sample_shape: tuple[int, ...]) -> torch.Tensor:
    """The samples of a /predict body as a float32 tensor ``(N, *sample_shape)``, or :class:`InvalidSamples`."""
    expected = (f'expected {{"samples": [...]}}: 1 to {MAX_BATCH} samples, each of shape {list(sample_shape)}, '
                "of finite numbers")
    if not body.strip():
        raise InvalidSamples(f"the body is empty; {expected}")
    try:
        request = _request_type(sample_shape).validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        if error["type"] == "json_invalid":
            raise InvalidSamples(f"the body is not JSON ({error['msg'].removeprefix('Invalid JSON: ')}); "
                                 f"{expected}") from None
        raise InvalidSamples(f"{_where(error['loc'])}: {error['msg']}; {expected}") from None
    with np.errstate(over="ignore"):  # a finite JSON number beyond float32's range becomes ±inf: refused next
        samples = np.asarray(request.samples, dtype=np.float32)
    if not np.isfinite(samples).all():
        first = int(np.argwhere(~np.isfinite(samples))[0][0])
        raise InvalidSamples(f"samples[{first}]: a value beyond float32's range (±3.4e38); {expected}")
    return torch.from_numpy(samples)


def answer(model: TrainedModel, body: bytes) -> tuple[bytes, int]:
    """``model``'s answers for the samples of a /predict ``body`` (:func:`read_samples`), as the JSON of
    :class:`Predictions` (serialized here, in the worker thread, rather than on the event loop), and how many
    samples it answers."""
    card = model.card
    answered = answers(model, read_samples(body, card.sample_shape))
    predictions: list[Prediction] | list[Estimate] | list[Detection]
    if card.task == CLASSIFICATION:
        best, classes = answered.max(dim=1)
        predictions = [Prediction(class_=c, probability=p, probabilities=row)
                       for c, p, row in zip(classes.tolist(), best.tolist(), answered.tolist())]
    elif card.task == ANOMALY:
        assert card.threshold is not None  # an anomaly card has one (ModelCard.from_metadata, ServedModel)
        predictions = [Detection(score=score, flag=score > card.threshold) for score in answered.tolist()]
    else:
        predictions = [Estimate(values=row) for row in answered.tolist()]
    result = Predictions(node=card.node, round=card.round, sha256=card.sha256, predictions=predictions)
    return result.model_dump_json(by_alias=True).encode(), len(answered)


async def _read_body(request: Request) -> bytes:
    """The body, at most :data:`MAX_BODY` bytes: a larger one (announced or sent) is 413, read no further."""
    announced = request.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > MAX_BODY:
        raise HTTPException(status_code=413, detail=f"the body has {announced} bytes; at most {MAX_BODY}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise HTTPException(status_code=413, detail=f"the body exceeds {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


Committed = Callable[[], Awaitable[TrainedModel | None]]  # the node's committed model; None before its first


def add_model_routes(app: FastAPI, committed: Committed, metrics: NodeMetrics) -> None:
    """``/model``, ``/model/info`` and ``/predict`` on ``app``, serving ``await committed()``."""
    working = asyncio.Semaphore(CONCURRENT)

    async def current() -> TrainedModel:
        try:
            model = await committed()
        except Exception as exc:  # the state folder gone under the node, a bug: the API itself stays up
            log.exception("the committed model is unavailable")
            raise HTTPException(status_code=503, detail=f"the model is unavailable: {exc}") from exc
        if model is None:
            raise HTTPException(status_code=503, detail="the node has not checkpointed a model yet (it is starting)")
        return model

    @app.get("/model", summary="The node's committed model as a safetensors file (its card in the metadata)",
             response_class=Response, responses={200: {"content": {"application/octet-stream": {}}}})
    async def get_model() -> Response:
        model = await current()
        data = await asyncio.to_thread(model.to_bytes)
        name = f"{model.card.node}-round{model.card.round}.safetensors"
        return Response(data, media_type="application/octet-stream",
                        headers={"content-disposition": f'attachment; filename="{name}"'})

    @app.get("/model/info", response_model=ModelInfo, summary="What /model serves and /predict accepts")
    async def get_model_info() -> ModelInfo:
        card = (await current()).card
        return ModelInfo(spec=card.spec, sample_shape=list(card.sample_shape), num_classes=card.num_classes,
                         task=card.task, threshold=card.threshold, fingerprint=card.fingerprint, node=card.node,
                         round=card.round, sha256=card.sha256, max_batch=MAX_BATCH, max_body_bytes=MAX_BODY)

    @app.post("/predict", response_model=Predictions, response_class=Response,
              summary=f"The model's answers (by its task) for a JSON batch of samples (at most {MAX_BATCH})",
              responses={200: {"content": {"application/json": {}}},
                         413: {"description": f"body over {MAX_BODY} bytes"},
                         422: {"description": "not a batch of this model's samples (one line says where)"}})
    async def predict(request: Request) -> Response:
        started = time.perf_counter()
        async with working:
            try:
                body = await _read_body(request)
            except HTTPException:
                metrics.predicted("too_large")
                raise
            try:
                content, samples = await asyncio.to_thread(answer, await current(), body)
            except InvalidSamples as exc:
                metrics.predicted("invalid")
                raise HTTPException(status_code=422, detail=str(exc)) from None
        metrics.observe("predict", time.perf_counter() - started)
        metrics.predicted("ok", samples)
        return Response(content, media_type="application/json")
