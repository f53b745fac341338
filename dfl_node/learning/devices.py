"""Where a node's tensors live: the ``device`` setting (``auto``, ``cpu``, ``cuda``) on this machine.

Models and data live on the device: a driver moves each node's data there once (never per batch)
and builds every ``w0`` on the CPU before moving it, so a model starts the same on any device.
Whatever leaves a node (a message on the wire, a checkpoint) goes through the CPU, and what arrives
is moved to the node's device. A requested ``cuda`` that this machine lacks is an error, never a
silent fallback; ``auto`` is the one setting that picks for itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def device_problem(name: str) -> str | None:
    """Why ``name`` cannot be used on this machine, in one line; None if it can. Torch is only imported
    for ``cuda``, so reading settings stays light."""
    if name != "cuda":
        return None
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        return None
    why = f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None else (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")
    return f"cuda is not available here: {why} (cpu, or auto, runs on this machine)"


def resolve_device(name: str) -> torch.device:
    """The ``torch.device`` for a ``device`` setting: ``auto`` is CUDA where ``torch.cuda.is_available()``,
    else the CPU; an unavailable ``cuda`` raises ``ValueError`` with :func:`device_problem`'s line."""
    import torch  # noqa: PLC0415

    problem = device_problem(name)
    if problem:
        raise ValueError(problem)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def use_backends(precision: str, cudnn_benchmark: bool) -> None:
    """The process's CUDA math modes for the ``precision`` and ``cudnn_benchmark`` settings: matrix products in
    TF32 only for ``tf32`` (PyTorch's default is full float32), cuDNN's own timing of algorithms on request.
    Convolutions keep PyTorch's default, ``torch.backends.cudnn.allow_tf32`` (True: TF32 on Ampere and newer),
    which is what ``fp32`` means here. Process-wide flags, as the thread count is: every node of a process (a
    simulation, its concurrent runs) has the same settings. Nothing the CPU computes depends on them."""
    import torch  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = cudnn_benchmark


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch's intra-op threads set to ``count`` (the ``threads`` setting) for the block, then put back.

    The number is process-wide and it decides the order of a float sum, so two drivers that must agree bit for
    bit run with the same one: a daemon sets it for its process (``serve``); an in-process driver (the
    simulator, K nodes on one loop) sets it here and puts the caller's back, so that what runs next in the
    process (another simulation, a test) starts from the same state as it would alone."""
    import torch  # noqa: PLC0415

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
