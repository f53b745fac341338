"""Settings that name something the package must know, shared by a node's and an experiment's settings: an
algorithm (:data:`AlgorithmName`, checked against the registry, built-ins and installed plugins) and the way
models' tensors travel (:data:`WireDtype`, :mod:`dfl_node.peering.wire_dtypes`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from dfl_node.registered import Registered


def _algorithms() -> Iterable[str]:
    from dfl_node.algorithms import algorithm_names  # noqa: PLC0415 - keeps torch out of reading settings

    return algorithm_names()


AlgorithmName = Annotated[str, Registered("algorithm", _algorithms)]

WireDtype = Literal["exact", "float16", "int8"]  # how models' floating tensors travel: dfl_node.peering.wire_dtypes
WIRE_DTYPE_HELP = ("how models' floating tensors travel: exact (as the model holds them), float16, or int8 (a "
                   "symmetric scale per tensor): 1/2 or 1/4 of float32's bytes, for slow links, at some accuracy; "
                   "the same on every node of a swarm (peers that differ refuse each other at Hello)")
