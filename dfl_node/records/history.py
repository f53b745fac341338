"""One event of a node's history (``GET /history``): what the learner records of every change to its model, and
what its checkpoint stores (as this record's JSON), so a change of this shape is a change of the checkpoint format
too."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["HistoryEntry", "SeriesAccuracy"]


class SeriesAccuracy(BaseModel):
    """Accuracies of another model a node reports beside its own (DFML's regular model, FML's meme model)."""

    local_accuracy: float | None = None
    global_accuracy: float | None = None


class HistoryEntry(BaseModel):
    """One event in the node's history (``GET /history``)."""

    round: int
    time: float = Field(description="unix time of the event")
    event: str = Field(description='"fusion", "train", "eval", …')
    role: str
    peer: str | None = None
    local_accuracy: float | None = None
    global_accuracy: float | None = None
    series: dict[str, SeriesAccuracy] = Field(default_factory=dict, description="where evaluated, the algorithm's "
                                              "other reported models, by name (DFML: regular; FML: meme)")
    bytes_received: int = Field(0, description="model bytes this node had received by then: summed over a fleet, "
                                "the bytes that crossed its wire")
    detail: dict[str, float | int | str] = Field(default_factory=dict)
