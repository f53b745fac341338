"""Client-selection probes as they travel (001): :class:`Probe` ⇄ :class:`ProbeRequest`, answers ⇄ :class:`ProbeReply`.

A probe is small, and checked like every model stream before anything is built from it: a known
mode; for ``probe-samples`` float32 samples of exactly this node's input shape, at most
:data:`~dfl_node.algorithms.selection.MAX_PROBE_SAMPLES` of them and at most
:data:`~dfl_node.algorithms.selection.MAX_PROBE_BYTES`, as many bytes as the shape says, one label
per sample within this node's classes. Samples travel as raw bytes and become a tensor only through
``torch.frombuffer``; nothing is unpickled. The algorithm then checks the values
(:func:`~dfl_node.algorithms.selection.check_probe`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dfl_node.algorithms.selection import MAX_PROBE_SAMPLES, MODES, Probe, ProbeAnswer, probe_budget
from dfl_node.peering.errors import TransferRejected


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    """A selecting sender's question to a candidate (the probe's local ``weights`` stay with the sender)."""

    sender: str = ""
    swarm: str = ""
    round: int = 0
    epoch: int = 0  # token epoch; 0 in async mode
    mode: str = ""  # "class-profile" (no data) or "probe-samples"
    dtype: str = ""  # probe-samples: "float32"
    shape: tuple[int, ...] = ()  # probe-samples: [n, C, H, W]
    samples: bytes = b""  # probe-samples: raw little-endian float32 values, C order
    labels: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ProbeReply:
    """A candidate's answer (its current model), or its refusal."""

    ok: bool = False
    reason: str = ""  # short stable code when not ok
    samples: int = 0
    correct: int = 0
    loss: float = 0.0
    class_accuracy: tuple[float, ...] = ()


def probe_request(probe: Probe, *, swarm: str, epoch: int) -> ProbeRequest:
    """The request a selecting sender sends each candidate."""
    if probe.x is None or probe.y is None:
        return ProbeRequest(sender=probe.sender, swarm=swarm, round=probe.round, epoch=epoch, mode=probe.mode)
    x = probe.x.detach().to("cpu", torch.float32).contiguous()
    return ProbeRequest(sender=probe.sender, swarm=swarm, round=probe.round, epoch=epoch, mode=probe.mode,
                        dtype="float32", shape=tuple(x.shape), samples=x.numpy().tobytes(),
                        labels=tuple(int(v) for v in probe.y.cpu()))


def probe_from_request(request: ProbeRequest, *, input_shape: Sequence[int], num_classes: int) -> Probe:
    """The probe a candidate received, or :class:`TransferRejected` (``bad_probe``) before any tensor is built."""
    def bad(detail: str) -> TransferRejected:
        return TransferRejected("bad_probe", detail)

    if request.mode not in MODES:
        raise bad(f"unknown selection mode {request.mode[:40]!r}")
    if request.mode == "class-profile":
        if request.samples or request.shape or request.labels or request.dtype:
            raise bad("a class-profile probe carries no samples")
        return Probe(request.sender, request.round, request.mode)
    limit = probe_budget(MAX_PROBE_SAMPLES, input_shape)
    shape = tuple(request.shape)
    if request.dtype != "float32":
        raise bad(f"probe samples must be float32, not {request.dtype[:20]!r}")
    if len(shape) != 1 + len(input_shape) or shape[1:] != tuple(input_shape) or not 1 <= shape[0] <= limit:
        raise bad(f"probe samples of shape {shape[:8]}: expected (n, {', '.join(map(str, input_shape))}), "
                  f"1 ≤ n ≤ {limit}")
    if len(request.samples) != 4 * math.prod(shape) or len(request.labels) != shape[0]:
        raise bad(f"{len(request.samples)} bytes and {len(request.labels)} labels for {shape[0]} samples")
    if any(label >= num_classes for label in request.labels):
        raise bad(f"probe labels outside 0..{num_classes - 1}")
    x = torch.frombuffer(bytearray(request.samples), dtype=torch.float32).reshape(shape)
    labels = torch.tensor(list(request.labels), dtype=torch.int64)
    return Probe(request.sender, request.round, request.mode, x=x, y=labels)


def probe_reply(answer: ProbeAnswer) -> ProbeReply:
    return ProbeReply(ok=True, samples=answer.samples, correct=answer.correct, loss=answer.loss,
                      class_accuracy=tuple(answer.class_accuracy))


def answer_from_reply(reply: ProbeReply, candidate: str) -> ProbeAnswer:
    """A candidate's answer as the sender's algorithm ranks it (it checks the values: ``check_answer``)."""
    return ProbeAnswer(candidate, samples=reply.samples, correct=reply.correct, loss=reply.loss,
                       class_accuracy=tuple(reply.class_accuracy))
