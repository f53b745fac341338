"""Client-selection probes on the wire (the Probe RPC): :class:`Probe` ⇄ ``ProbeRequest``, answers ⇄ ``ProbeReply``.

A probe is small and unary, and checked like every model stream before anything is built from it:
a known mode; for ``probe-samples`` float32 samples of exactly this node's input shape, at most
:data:`~dfl_node.algorithms.selection.MAX_PROBE_SAMPLES` of them and at most
:data:`~dfl_node.algorithms.selection.MAX_PROBE_BYTES`, as many bytes as the shape says, one label
per sample within this node's classes. Samples become a tensor only through ``torch.frombuffer``;
nothing is unpickled. The algorithm then checks the values (:func:`~dfl_node.algorithms.selection.check_probe`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dfl_node.algorithms.selection import MAX_PROBE_SAMPLES, MODES, Probe, ProbeAnswer, probe_budget
from dfl_node.net.codec import TransferRejected
from dfl_node.net.proto import dfl_pb2 as pb


def probe_request(probe: Probe, *, swarm: str, epoch: int) -> pb.ProbeRequest:
    """The request a selecting sender sends each candidate (the probe's local ``weights`` stay here)."""
    request = pb.ProbeRequest(sender=probe.sender, swarm=swarm, round=probe.round, epoch=epoch, mode=probe.mode)
    if probe.x is not None and probe.y is not None:
        x = probe.x.detach().to("cpu", torch.float32).contiguous()
        request.dtype = "float32"
        request.shape.extend(x.shape)
        request.samples = x.numpy().tobytes()
        request.labels.extend(int(v) for v in probe.y.cpu())
    return request


def probe_from_request(request: pb.ProbeRequest, *, input_shape: Sequence[int], num_classes: int) -> Probe:
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
    return Probe(request.sender, request.round, request.mode, x=x, y=torch.tensor(list(request.labels), dtype=torch.int64))


def probe_reply(answer: ProbeAnswer) -> pb.ProbeReply:
    return pb.ProbeReply(ok=True, samples=answer.samples, correct=answer.correct, loss=answer.loss,
                         class_accuracy=answer.class_accuracy)


def answer_from_reply(reply: pb.ProbeReply, candidate: str) -> ProbeAnswer:
    """A candidate's answer as the sender's algorithm ranks it (it checks the values: ``check_answer``)."""
    return ProbeAnswer(candidate, samples=reply.samples, correct=reply.correct, loss=reply.loss,
                       class_accuracy=tuple(reply.class_accuracy))
