"""What ``/model/info`` and ``/predict`` answer (:mod:`dfl_node.api.serving`): the model a node serves and its
predictions. The records the node keeps (status, history, fleet) are in :mod:`dfl_node.records`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Detection", "Estimate", "ModelInfo", "Prediction", "Predictions"]


class ModelInfo(BaseModel):
    """``GET /model/info``: the model ``/model`` serves and ``/predict`` answers with, and what a request may hold."""

    spec: str = Field(description="the architecture, a registry spec (e.g. mlp:32,32)")
    sample_shape: list[int] = Field(description="the shape of one sample: (F,), (C, L), (C, H, W)…")
    num_classes: int = Field(description="the model's output width: classes (classification), targets (regression), "
                             "a sample's values (anomaly: an autoencoder's reconstruction)")
    task: str = Field(default="classification", description="what /predict answers: classification (a class and "
                      "probabilities), anomaly (a score and a flag), regression or another task (the values)")
    threshold: float | None = Field(default=None, description="anomaly: a sample is flagged where its score exceeds "
                                    "it (a quantile of the node's validation scores for this model)")
    fingerprint: str = Field(description="sha256 of the architecture and its tensor names, shapes and dtypes")
    node: str
    round: int = Field(description="rounds the node had completed when this model was checkpointed")
    sha256: str = Field(description="digest of the weights (param_sha256 of /status, for the node's own model)")
    max_batch: int = Field(description="the most samples one /predict request may hold")
    max_body_bytes: int = Field(description="the largest /predict body accepted")


class Prediction(BaseModel):
    """One sample's answer of a classifier."""

    model_config = ConfigDict(populate_by_name=True)

    class_: int = Field(alias="class", description="the most probable class")
    probability: float = Field(description="its probability")
    probabilities: list[float] = Field(description="every class's probability (softmax of the logits)")


class Estimate(BaseModel):
    """One sample's answer of a regressor (or of a plugin's task): the model's outputs."""

    values: list[float] = Field(description="the predicted targets (num_classes of /model/info)")


class Detection(BaseModel):
    """One sample's answer of an anomaly detector."""

    score: float = Field(description="its anomaly score: the mean squared error of the model's reconstruction")
    flag: bool = Field(description="anomalous: the score exceeds the model's threshold (/model/info)")


class Predictions(BaseModel):
    """``POST /predict``'s answer: per sample, in the request's order, and the model that gave it."""

    node: str
    round: int
    sha256: str = Field(description="digest of the weights that answered (as /model/info says)")
    predictions: list[Prediction] | list[Estimate] | list[Detection] = Field(description="by the model's task "
                                                                             "(/model/info): one kind for all")
