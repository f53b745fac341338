"""Local training and mutual knowledge transfer on CUDA as replays of captured CUDA graphs, one graph per epoch.

Why: a step of 000's CNN at B = 200 is about a hundred small kernels. Launched one by one from Python the GPU
waits for the launches (measured: 1.3–1.6 ms a step eagerly, for ~0.1 ms of arithmetic). Captured once, a whole
epoch — its gathers, forward and backward passes, SGD-with-momentum updates and loss sum — is one launch, and
nothing in it reads a value back to the host.

What is captured is the eager code itself (:func:`~dfl_node.learning.training.local_epoch`,
:func:`~dfl_node.learning.fusion.mkt_epoch`; their graphed trainers live beside them: ``graphed_local_sgd``,
``graphed_mkt``), over tensors that stay where they are:

* the epoch's row order: drawn on the CPU generator exactly as the eager loop draws it, all of an update's epochs
  copied to the device at once, and each epoch's row copied into the order the graph reads (an on-device copy);
* the optimisers' momentum buffers, allocated once and zeroed as an update starts: a first step's ``0·m + g`` is
  the eager ``buffer = g`` (the same bits, but for the sign of a zero);
* the loss sum (the mean loss :func:`~dfl_node.learning.training.local_sgd` returns), read once per update.

Every caller writes models in place (``load_state_dict``, ``copy_``, ``lerp_``: the fusions, checkpoint restores,
the nodes' spare models), so the addresses a graph captured stay theirs. A graph is looked up by those addresses
(the models' tensors and the data's), shapes, optimiser settings, precision and cuDNN/cuBLAS modes: a model whose
tensors moved gets a graph of its own, and graphs go when their models do (at most :data:`CACHE_LIMIT` in all).

A new graph first runs one epoch eagerly, in the identity order, on the real models — every batch shape, so that
cuDNN and cuBLAS settle their algorithms and workspaces outside the capture — then puts the models back. Captures
are ``thread_local``: runs in other threads of the process (``--per-device N --streams``) go on meanwhile. Where
CUDA refuses a capture, or a model has a trainable tensor that gets no gradient, its models train eagerly (a
warning says so for the former); :data:`COUNTS` says how many graphs were recorded and declined.

:class:`EagerRecorder` stands in for a CUDA graph where there is none: its replay calls the body. The tests run all
of this but the capture itself on the CPU with it and hold it to the eager loop's bits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import torch
from torch import nn

from dfl_node.learning.datasets import ArrayDataset

log = logging.getLogger(__name__)
CACHE_LIMIT = 128  # graphs kept at most; a run holds 1–2 per node (its trained model, its MKT pair)
Body = Callable[[torch.Tensor, torch.Tensor], None]  # (static order, static loss sum) -> one epoch


class Recorder(Protocol):
    """Records an epoch once and runs it again on demand."""

    def record(self, warm_up: Callable[[], None], epoch: Callable[[], None]) -> None: ...
    def replay(self) -> None: ...


class CudaGraphRecorder:
    """A CUDA graph: ``record`` runs the warm-up and then captures ``epoch`` (its kernels are recorded, not run) on
    a side stream, as CUDA graphs require; ``replay`` launches them on the current stream."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def record(self, warm_up: Callable[[], None], epoch: Callable[[], None]) -> None:
        current, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            warm_up()
            self.graph.capture_begin(capture_error_mode="thread_local")
            try:
                epoch()
            except BaseException:
                with contextlib.suppress(Exception):  # the capture is void: its own error would hide the cause
                    self.graph.capture_end()
                raise
            self.graph.capture_end()
        current.wait_stream(side)

    def replay(self) -> None:
        self.graph.replay()


class EagerRecorder:
    """The stand-in where there is no CUDA: ``replay`` calls the epoch (the tests' way to run this module)."""

    def __init__(self) -> None:
        self.epoch: Callable[[], None] | None = None

    def record(self, warm_up: Callable[[], None], epoch: Callable[[], None]) -> None:
        warm_up()
        self.epoch = epoch

    def replay(self) -> None:
        assert self.epoch is not None, "replay before record"
        self.epoch()


class Optimiser(Protocol):
    """What a graph needs of an optimiser (:class:`~dfl_node.learning.training.Sgd`): its parameters, momentum
    buffers (made static here) and gradients."""

    parameters: list[torch.Tensor]
    momentum: float
    buffers: list[torch.Tensor] | None

    def zero_grad(self) -> None: ...


class NotCapturable(Exception):
    """A model some of whose trainable tensors get no gradient: its momentum buffers could not be static."""


class EpochGraph:
    """One kind of epoch — ``body`` training ``models`` with ``optimizers`` over ``data`` — recorded once, replayed
    once per epoch of every update that follows."""

    def __init__(self, models: Sequence[nn.Module], optimizers: Sequence[Optimiser], data: ArrayDataset, body: Body,
                 recorder: Recorder) -> None:
        device = data.x.device
        self.order = torch.arange(len(data), device=device)  # the row order the graph reads
        self.total = torch.zeros((), dtype=torch.float64, device=device)  # the loss sum it adds to
        self.buffers: list[torch.Tensor] = []  # the optimisers' momentum buffers, made by the warm-up
        self.recorder = recorder
        self._host: torch.Tensor | None = None  # pinned staging of an update's orders (CUDA)
        self._orders: torch.Tensor | None = None  # the same on the device
        self._copied: torch.cuda.Event | None = None  # when the staging buffer may be written again
        # Nothing here holds the models once recorded (a CUDA graph needs their addresses, not them): the cache
        # drops a graph when its models go (:func:`_cached`). The eager stand-in's epoch holds them, for tests.
        recorder.record(lambda: self._warm_up(models, optimizers, body), lambda: body(self.order, self.total))
        for optimizer in optimizers:
            optimizer.zero_grad()  # the last captured step's gradients: the graph writes them, nobody reads them

    def _warm_up(self, models: Sequence[nn.Module], optimizers: Sequence[Optimiser], body: Body) -> None:
        """One eager epoch on the real models, undone: lazy initialisations (cuDNN's and cuBLAS's choices and
        workspaces, for every batch shape) happen here rather than in the capture. Then the momentum buffers the
        graph will hold, one per parameter the epoch stepped, which must be every trainable one."""
        saved = [[t.clone() for t in model.state_dict().values()] for model in models]
        body(self.order, self.total)
        stepped = all(p.grad is not None for o in optimizers for p in o.parameters if p.requires_grad)
        with torch.no_grad():
            for model, values in zip(models, saved):
                for tensor, value in zip(model.state_dict().values(), values):
                    tensor.copy_(value)
        if not stepped:
            raise NotCapturable("some trainable parameters get no gradient")
        for optimizer in optimizers:
            trainable = [p for p in optimizer.parameters if p.requires_grad]
            optimizer.buffers = [torch.zeros_like(p) for p in trainable] if optimizer.momentum else None
        self.buffers = [b for optimizer in optimizers for b in optimizer.buffers or []]
        self._reset()
        for optimizer in optimizers:  # the capture's backward passes then make gradients in the graph's own memory
            optimizer.zero_grad()

    def _reset(self) -> None:
        self.total.zero_()
        if self.buffers:
            torch._foreach_zero_(self.buffers)

    def run(self, orders: torch.Tensor) -> None:
        """One update: an epoch per row of ``orders`` (on the CPU, as drawn), from zeroed momentum and loss sum."""
        self._reset()
        for order in self._stage(orders):
            self.order.copy_(order)
            self.recorder.replay()

    def _stage(self, orders: torch.Tensor) -> torch.Tensor:
        """``orders`` on the device, copied there at once from pinned memory without waiting for the GPU."""
        if not self.order.is_cuda:
            return orders
        if self._host is None or self._host.shape != orders.shape:
            self._host = torch.empty(orders.shape, dtype=orders.dtype, pin_memory=True)
            self._orders = torch.empty(orders.shape, dtype=orders.dtype, device=self.order.device)
            self._copied = torch.cuda.Event()
        else:
            assert self._copied is not None
            self._copied.synchronize()  # the last update's copy has left the staging buffer
        assert self._orders is not None and self._copied is not None
        self._host.copy_(orders)
        self._orders.copy_(self._host, non_blocking=True)
        self._copied.record()
        return self._orders


_CACHE: OrderedDict[Hashable, EpochGraph | None] = OrderedDict()  # None: not capturable, train eagerly
COUNTS = {"recorded": 0, "declined": 0}  # this process's graphs so far (the benchmark checks the path it timed)
_LOCK = threading.Lock()  # guards the cache and the counts
_BUILDING = threading.Lock()  # one warm-up and capture at a time in the process: captures of concurrent runs
# (threads) never overlap, nor does one with another's first cuDNN/cuBLAS calls made in a warm-up


def _cached(key: Hashable, owners: Sequence[object], build: Callable[[], EpochGraph]) -> EpochGraph | None:
    """The graph under ``key``, built on first use (outside the cache's lock: a capture takes a while, and other
    threads replay meanwhile; a key's models belong to one run, so one thread). It goes when one of ``owners``
    does."""
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    try:
        with _BUILDING:
            graph: EpochGraph | None = build()
    except NotCapturable:
        graph = None
    except RuntimeError as exc:  # CUDA refused the capture: these models train eagerly, as without the setting
        log.warning("a CUDA graph could not be recorded, training eagerly instead: %s", str(exc).splitlines()[0])
        graph = None
    with _LOCK:
        COUNTS["recorded" if graph is not None else "declined"] += 1
        _CACHE[key] = graph
        evicted = [_CACHE.popitem(last=False) for _ in range(len(_CACHE) - CACHE_LIMIT)]
    for owner in owners:
        weakref.finalize(owner, _forget, key)
    if evicted and torch.cuda.is_available():
        torch.cuda.synchronize()  # no replay of an evicted graph is still running when its memory goes
    return graph


def _forget(key: Hashable) -> None:
    with _LOCK:
        _CACHE.pop(key, None)


def clear() -> None:
    """Drop every graph (tests, benchmarks that compare fresh captures)."""
    with _LOCK:
        _CACHE.clear()


def _key(kind: str, models: Sequence[nn.Module], data: ArrayDataset, settings: Hashable,
         recorder: Callable[[], Recorder]) -> Hashable:
    tensors = tuple((t.data_ptr(), tuple(t.shape), t.dtype) for m in models for t in m.state_dict().values())
    modes = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic)
    return (kind, recorder, str(data.x.device), tensors, data.x.data_ptr(), tuple(data.x.shape), data.y.data_ptr(),
            settings, modes)


def graph_for(kind: str, models: Sequence[nn.Module], data: ArrayDataset, settings: Hashable,
              build: Callable[[], EpochGraph], recorder: Callable[[], Recorder]) -> EpochGraph | None:
    """The graph of a ``kind`` of epoch (``local``, ``mkt``) training ``models`` over ``data`` with the optimiser
    ``settings`` (what the graph bakes in: learning rates, momenta, batch size, precision), made by ``build`` on
    first use; None where it cannot be captured (the caller trains eagerly)."""
    if not len(data):
        return None
    return _cached(_key(kind, models, data, settings, recorder), [*models, data], build)


def orders(data: ArrayDataset, generator: torch.Generator, epochs: int) -> torch.Tensor:
    """An update's row orders, drawn as the eager loop draws them (one permutation per epoch, in turn)."""
    return torch.stack([torch.randperm(len(data), generator=generator) for _ in range(epochs)])
