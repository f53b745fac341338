"""Whether a peer's Hello is one this node can learn with, and if not, why: a stable reason (what ``/status``
counts, and a HelloReply tells the peer) and a one-line detail an operator can act on.

A peer is compatible when it speaks our protocol version, is in our swarm, runs our algorithm (one installed
here), sends models as our wire does, runs a model this node can build from what is installed here, and that
model's fingerprint is the one our registry gives it for our data. The checks run in that order, so a peer is
told the first thing to change; a fingerprint that differs is explained by the data where the Hellos say how
(another sample shape: a 5-feature device among 6-feature ones; another number of classes).

Everything about the peer comes from its Hello, so every value put into a detail is cut short: a peer's word is
shown, never trusted to be short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms import is_algorithm
from dfl_node.learning.models import ModelSpec
from dfl_node.peering.messages import Hello
from dfl_node.peering.wire_dtypes import EXACT
from dfl_node.plugins import PluginError

CLASSIFICATION = "classification"  # the task a Hello without one names

# The reasons of an incompatible peer, in the order they are checked: each is refused at Hello, counted by reason
# (``/status`` rejected, ``dfl_rejected_total``) and listed in ``/status`` refused_peers on both sides.
REASONS = ("protocol_version", "swarm_mismatch", "unknown_algorithm", "algorithm_mismatch", "task_mismatch",
           "wire_dtype_mismatch",
           "unknown_model", "architecture_mismatch", "sample_shape_mismatch", "num_classes_mismatch",
           "fingerprint_mismatch")
MAX_TEXT = 64  # characters of a peer's string shown in a detail
MAX_DIMS = 8  # dimensions of a peer's sample shape shown (more: not data of ours anyway)


@dataclass(frozen=True)
class Verdict:
    reason: str
    detail: str


def _text(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…")


def _shape(shape: tuple[int, ...]) -> str:
    dims = [str(d) for d in shape[:MAX_DIMS]] + (["…"] if len(shape) > MAX_DIMS else [])
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"


def check(ours: Hello, theirs: Hello, fingerprint_of: Callable[[str], str]) -> Verdict | None:
    """None if this node (whose Hello is ``ours``) can learn with the sender of ``theirs``; else why not.
    ``fingerprint_of``: the fingerprint a model spec has here (a ValueError for one our algorithm cannot fuse)."""
    if theirs.protocol_version != PROTOCOL_VERSION:
        return Verdict("protocol_version", f"theirs {theirs.protocol_version}, ours {PROTOCOL_VERSION}: run one "
                       "dfl-node version on every node")
    if theirs.swarm != ours.swarm:
        return Verdict("swarm_mismatch", f"theirs {_text(theirs.swarm)}, ours {ours.swarm!r}")
    if not is_algorithm(theirs.algorithm):
        return Verdict("unknown_algorithm", f"theirs {_text(theirs.algorithm)} is neither built in nor installed "
                       "here (dfl-node plugins)")
    if theirs.algorithm != ours.algorithm:
        return Verdict("algorithm_mismatch", f"theirs {_text(theirs.algorithm)}, ours {ours.algorithm!r}")
    if theirs.task != ours.task:  # "" is classification on both sides: what every Hello said before tasks
        return Verdict("task_mismatch", f"theirs {_text(theirs.task or CLASSIFICATION)}, ours "
                       f"{ours.task or CLASSIFICATION!r}: give every node the same --task")
    if (theirs.wire_dtype or EXACT) != ours.wire_dtype:
        return Verdict("wire_dtype_mismatch", f"theirs {_text(theirs.wire_dtype or EXACT)}, ours {ours.wire_dtype!r}")
    try:
        if theirs.model != ours.model:  # ours parsed when we started (a thousand members share it: not again)
            ModelSpec.parse(theirs.model)
    except ValueError:
        return Verdict("unknown_model", f"theirs {_text(theirs.model)} is neither built in, installed here "
                       "(dfl-node plugins), nor the package.module:factory this node runs")
    try:
        expected = fingerprint_of(theirs.model)
    except PluginError as exc:  # an installed plugin that fails to load or to build for our data
        return Verdict("unknown_model", str(exc)[:300])
    except ValueError:
        return Verdict("architecture_mismatch", f"theirs {_text(theirs.model)}, ours {ours.model!r}: "
                       f"{ours.algorithm} fuses identical architectures only")
    if theirs.fingerprint == expected:
        return None
    if theirs.sample_shape and tuple(theirs.sample_shape) != tuple(ours.sample_shape):
        return Verdict("sample_shape_mismatch", f"samples {_shape(tuple(theirs.sample_shape))} there, "
                       f"{_shape(tuple(ours.sample_shape))} here: other features, or another layout")
    if theirs.num_classes and theirs.num_classes != ours.num_classes:
        return Verdict("num_classes_mismatch", f"{theirs.num_classes} classes there, {ours.num_classes} here: give "
                       "every node the same --num-classes")
    return Verdict("fingerprint_mismatch", f"their {_text(theirs.model)} has other tensors than ours on the same "
                   "data (other widths, or another version of the model's code)")


def their_refusal(reason: str, ours: Hello, theirs: Hello) -> str:
    """The detail of a refusal the peer sent us (its HelloReply's reason): the same words as :func:`check`
    gives where the reason is symmetric, and what the peer could not do where it is not."""
    if reason == "unknown_model":
        return f"it cannot build our model {ours.model!r}: not installed there (dfl-node plugins)"
    if reason == "unknown_algorithm":
        return f"it does not have our algorithm {ours.algorithm!r}: not installed there (dfl-node plugins)"
    if reason == "architecture_mismatch":
        return f"theirs {_text(theirs.model)}, ours {ours.model!r}: it fuses identical architectures only"
    if reason == "fingerprint_mismatch":
        return f"our {ours.model!r} has other tensors than theirs on the same data"
    verdict = check(ours, theirs, lambda model: "")  # the symmetric ones, in the same words
    return verdict.detail if verdict is not None and verdict.reason == reason else ""
