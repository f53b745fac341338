"""The receiver's half of a transfer: frames back into a :class:`ModelMessage`, checked before anything is allocated.

The receiver (:class:`MessageAssembler`) checks the whole header against its own model before it
allocates anything, then copies chunks into one buffer, reused across transfers, and hashes them in the
intake thread as they arrive (both :mod:`dfl_node.net.buffers`), so the event loop only hands chunks on.
It holds what arrived of a stream that was cut, for the stream that resumes it. The format is
:mod:`dfl_node.net.manifest`'s; the sender's half is :mod:`dfl_node.net.encoder`.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from concurrent.futures import Future

import torch

import dfl_node
from dfl_node.algorithms.messages import ModelMessage, TensorPart
from dfl_node.hashes import DEFAULT_HASH, DIGEST_BYTES, HASHES, OFFERED_HASHES, Hasher
from dfl_node.net.buffers import INTAKE, MAX_PENDING_CHUNKS, BufferPool, absorb
from dfl_node.net.frames import ReadFrame
from dfl_node.net.manifest import ALLOWED_DTYPES, ENCODING_NAMES, Limits, Manifest, Resolver, numel
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.wire_dtypes import ENCODINGS, EXACT, INT8_LEVELS, decode, encoding

# What a payload is: a stream that resumes a cut one must name the same (only its resume flags may differ).
_PAYLOAD_FIELDS = ("sender", "swarm", "protocol_version", "round", "purpose", "fingerprint", "manifest", "total_size",
                   "digest", "hash", "num_samples", "metadata", "epoch", "model")


class MessageAssembler:
    """Consumes frames one at a time, validating as early as possible (the header before any allocation).

    After the first rejection every further :meth:`feed` / :meth:`finish` raises the same rejection.
    A header naming the receiver's own architecture (``model``) must carry its ``fingerprint`` and
    fit its ``manifest``; another architecture is accepted only through ``resolve``, which builds its
    layout from the receiver's own registry (and raises ``ValueError`` for one it cannot fuse).
    """

    def __init__(
        self, *, swarm: str, fingerprint: str, manifest: Manifest, limits: Limits = Limits(),
        protocol_version: int = dfl_node.PROTOCOL_VERSION, buffers: BufferPool | None = None,
        model: str = "", resolve: Resolver | None = None, hashes: Collection[str] = OFFERED_HASHES,
        wire_dtype: str = EXACT,
    ) -> None:  # fmt: skip
        self._swarm = swarm
        self._fingerprint = fingerprint
        self._manifest = manifest
        self._model = model
        self._resolve = resolve
        self._limits = limits
        self._version = protocol_version
        self._buffers = buffers
        self._hashes = tuple(h for h in hashes if h in HASHES)  # those we offered: a header naming another is refused
        self._wire_dtype = wire_dtype
        self._header: pb.TransferHeader | None = None
        self._buf: bytearray | None = None
        self._received = 0
        self._digest: Hasher | None = None  # the header's hash, once checked
        self._pending: collections.deque[Future[None]] = collections.deque()  # chunks handed to the intake thread
        self._failed: TransferRejected | None = None

    @property
    def header(self) -> pb.TransferHeader | None:
        return self._header

    @property
    def complete(self) -> bool:
        """True once a valid header arrived and all ``total_size`` payload bytes with it."""
        return self._header is not None and self._received == self._header.total_size

    @property
    def received(self) -> int:
        """Payload bytes taken so far, in order (each chunk copied and hashed, or on its way to be)."""
        return self._received

    def _reject(self, reason: str, detail: str) -> TransferRejected:
        self._failed = TransferRejected(reason, detail)
        return self._failed

    def feed(self, frame: ReadFrame) -> None:
        """Take the next frame: a protobuf ``Frame``, or a chunk's payload as decoded by
        :func:`~dfl_node.net.frames.decode_frame`."""
        if self._failed is not None:
            raise self._failed
        kind = "chunk" if isinstance(frame, memoryview) else frame.WhichOneof("kind")
        if self._header is None:
            self.begin(self.first_header(frame))
            return
        assert self._buf is not None  # taken with the header
        if kind != "chunk":
            raise self._reject("unexpected_frame", f"expected a chunk after the header, got {kind or 'nothing'}")
        data = frame if isinstance(frame, memoryview) else memoryview(frame.chunk.data)
        if data.nbytes > self._limits.max_chunk_bytes:
            raise self._reject("chunk_too_large", f"{data.nbytes} bytes > {self._limits.max_chunk_bytes}")
        end = self._received + data.nbytes
        if end > self._header.total_size:
            raise self._reject("trailing_data", f"{end} bytes received, header said {self._header.total_size}")
        assert self._digest is not None
        self._pending.append(INTAKE.submit(absorb, self._digest, memoryview(self._buf)[self._received : end], data))
        self._received = end

    def behind(self) -> Future[None] | None:
        """The oldest chunk the intake thread has yet to absorb, once more than :data:`MAX_PENDING_CHUNKS` wait
        (each holds its gRPC message): wait for it before reading on, so a receiver that falls behind slows
        its sender (gRPC's flow control) instead of buffering the stream."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        return self._pending[0] if len(self._pending) > MAX_PENDING_CHUNKS else None

    def first_header(self, frame: ReadFrame) -> pb.TransferHeader:
        """The header a stream's first ``frame`` must be, checked before anything is allocated for it (else the
        rejection); :meth:`begin` (or :meth:`resume`) takes its payload."""
        if self._failed is not None:
            raise self._failed
        if isinstance(frame, memoryview) or frame.WhichOneof("kind") != "header":
            kind = "chunk" if isinstance(frame, memoryview) else frame.WhichOneof("kind")
            raise self._reject("unexpected_frame", f"expected a header first, got {kind or 'an empty frame'}")
        self._check_header(frame.header)
        return frame.header

    def begin(self, h: pb.TransferHeader) -> None:
        """Take the payload of a checked header (:meth:`first_header`) from its first byte: its receive buffer and
        its digest."""
        if h.start:
            raise self._reject("bad_resume", f"the stream goes on from byte {h.start}, but nothing of it is held here")
        self._header = h
        self._digest = HASHES[h.hash or DEFAULT_HASH]()  # checked: one we offered
        size = h.total_size  # safe to allocate: bounded by the checks
        self._buf = self._buffers.take(size) if self._buffers is not None else bytearray(size)

    def continues(self, h: pb.TransferHeader) -> bool:
        """Whether ``h`` names the payload this assembler holds part of (a stream that was cut): the same sender,
        round, purpose, architecture, manifest, size and digest. Only its flags of a resumed stream may differ."""
        held = self._header
        return held is not None and all(getattr(h, name) == getattr(held, name) for name in _PAYLOAD_FIELDS)

    def resume(self, h: pb.TransferHeader, start: int | None = None) -> None:
        """Go on with the payload this assembler holds part of, from where it stopped, under header ``h`` (which
        :meth:`continues` it); ``start``: where the new stream begins (default: the header's own ``start``)."""
        start = h.start if start is None else start
        if not self.continues(h) or start != self._received:
            raise TransferRejected("bad_resume", f"the stream goes on from byte {start} of another payload or place "
                                                 f"than the {self._received} bytes held here")
        self._failed = None  # the cut that stopped it
        self._header = h

    def _check_header(self, h: pb.TransferHeader) -> None:
        lim = self._limits
        if (size := h.ByteSize()) > lim.max_header_bytes:
            raise self._reject("header_too_large", f"{size} bytes > {lim.max_header_bytes}")
        if h.protocol_version != self._version:
            raise self._reject("protocol_version", f"peer speaks {h.protocol_version}, we speak {self._version}")
        if h.swarm != self._swarm:
            raise self._reject("swarm_mismatch", f"peer swarm {h.swarm!r}, ours {self._swarm!r}")
        manifest = self._layout(h)
        if h.total_size > lim.max_total_bytes:
            raise self._reject("too_large", f"{h.total_size} bytes > {lim.max_total_bytes}")
        if len(h.manifest) > lim.max_tensors:
            raise self._reject("bad_manifest", f"{len(h.manifest)} entries > {lim.max_tensors}")
        self._check_digest(h)
        offset = decoded = 0
        ranges: dict[str, list[tuple[int, int]]] = {}
        for e in h.manifest:
            if e.name not in manifest:
                raise self._reject("unknown_tensor", f"{e.name!r} is not in a {h.model or 'our'} model")
            want_dtype, want_shape = manifest[e.name]
            dtype = ALLOWED_DTYPES.get(e.dtype)
            if dtype is None or dtype != want_dtype:
                raise self._reject("dtype_not_allowed", f"{e.name!r}: dtype {e.dtype!r}, expected {want_dtype}")
            if tuple(e.shape) != tuple(want_shape):
                raise self._reject("shape_mismatch", f"{e.name!r}: shape {tuple(e.shape)}, ours {tuple(want_shape)}")
            if e.start + e.count > numel(tuple(want_shape)):
                raise self._reject("bad_manifest", f"{e.name!r}: elements {e.start}+{e.count} beyond the tensor")
            travels_as = self._check_encoding(e, dtype)
            if e.nbytes != e.count * travels_as.itemsize or e.offset != offset:
                raise self._reject("bad_manifest", f"{e.name!r}: nbytes/offset do not follow the previous entry")
            offset += e.nbytes
            decoded += e.count * dtype.itemsize
            ranges.setdefault(e.name, []).append((e.start, e.start + e.count))
        if offset != h.total_size:
            raise self._reject("bad_manifest", f"entries cover {offset} bytes, total_size is {h.total_size}")
        if decoded > lim.max_total_bytes:  # a lossy payload decodes to up to 4x its size
            raise self._reject("too_large", f"{decoded} bytes decoded > {lim.max_total_bytes}")
        for name, spans in ranges.items():
            spans.sort()
            if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
                raise self._reject("bad_manifest", f"{name!r}: overlapping ranges")

    def _check_digest(self, h: pb.TransferHeader) -> None:
        """The header names a hash we offered (none: sha256, an older sender) and carries a digest of its size."""
        name = h.hash or DEFAULT_HASH
        if name not in self._hashes:
            raise self._reject("hash_not_offered", f"the payload's digest is {name[:40]!r}; we offered "
                                                   f"{', '.join(self._hashes)}")
        if len(h.digest) != DIGEST_BYTES:
            raise self._reject(f"bad_{name}", f"a {name} digest is {DIGEST_BYTES} bytes, got {len(h.digest)}")

    def _check_encoding(self, e: pb.TensorEntry, dtype: torch.dtype) -> torch.dtype:
        """What entry ``e`` of a ``dtype`` tensor travels as: exactly what our own wire dtype sends (a peer with
        another setting is refused at Hello; a header that differs anyway is refused here), and int8 with a
        finite positive scale whose 127 steps stay finite in ``dtype``."""
        expected = encoding(dtype, self._wire_dtype)
        want = ENCODING_NAMES[expected] if expected is not None else ""
        if e.encoding != want:
            raise self._reject("wire_dtype_mismatch", f"{e.name!r} travels as {(e.encoding or e.dtype)[:40]!r}; our "
                                                      f"wire dtype ({self._wire_dtype}) sends {e.dtype} as "
                                                      f"{want or e.dtype}")
        if expected == torch.int8:
            if not (math.isfinite(e.scale) and 0 < e.scale * INT8_LEVELS <= torch.finfo(dtype).max):
                raise self._reject("bad_scale", f"{e.name!r}: int8 scale {e.scale!r} is not finite and positive in "
                                                f"{e.dtype}")
        elif e.scale != 0:
            raise self._reject("bad_scale", f"{e.name!r}: a scale ({e.scale!r}) on a tensor that is not int8")
        return expected or dtype

    def _layout(self, h: pb.TransferHeader) -> Manifest:
        """The manifest the payload must fit: ours, or that of the (fusable) architecture the header names."""
        if h.model == self._model or self._resolve is None:
            if h.model != self._model or h.fingerprint != self._fingerprint:
                raise self._reject("fingerprint_mismatch", f"peer model {h.model!r} {h.fingerprint!r}, "
                                   f"ours {self._model!r} {self._fingerprint!r}")
            return self._manifest
        try:
            fingerprint, manifest = self._resolve(h.model)
        except ValueError as exc:
            raise self._reject("model_not_fusable", str(exc)) from None
        if h.fingerprint != fingerprint:
            raise self._reject("fingerprint_mismatch",
                               f"{h.model} is {fingerprint!r} here, the peer says {h.fingerprint!r}")
        return manifest

    def ended(self) -> pb.TransferHeader:
        """The stream ended: its header if every byte it announced arrived, else the refusal (``truncated``).
        Checked as the stream ends, before anything else is awaited: a sender that died mid-stream ends its
        stream and then has gRPC cancel the call, and its refusal must be counted before that cancel lands."""
        if self._failed is not None:
            raise self._failed
        h = self._header
        if h is None or self._buf is None:
            raise self._reject("truncated", "the stream ended before a header")
        if self._received != h.total_size:
            raise self._reject("truncated", f"{self._received} of {h.total_size} bytes received")
        return h

    def finish(self) -> tuple[pb.TransferHeader, ModelMessage]:
        """Check completeness and the digest, then build the message (tensors are views of, or copies from, the
        buffer; decoded from it where they travelled encoded)."""
        h = self.ended()
        assert self._digest is not None  # taken with the header
        while self._pending:
            self._pending.popleft().result()
        hash_name = h.hash or DEFAULT_HASH
        if self._digest.digest() != h.digest:
            raise self._reject(f"bad_{hash_name}", f"payload does not match the header's {hash_name}")
        parts = tuple(
            TensorPart(e.name, tuple(e.shape), e.start, self._tensor(e)) for e in h.manifest
        )
        msg = ModelMessage(
            sender=h.sender, round=h.round, purpose=h.purpose, num_samples=h.num_samples, parts=parts, model=h.model,
            metadata=dict(h.metadata),
        )  # fmt: skip
        return h, msg

    def _tensor(self, e: pb.TensorEntry) -> torch.Tensor:
        dtype = ALLOWED_DTYPES[e.dtype]
        if e.count == 0:
            return torch.empty(0, dtype=dtype)
        if e.encoding:  # checked: what our wire dtype sends; decoded to a tensor of its own
            wire_values = torch.frombuffer(self._buf, dtype=ENCODINGS[e.encoding], count=e.count, offset=e.offset)
            return decode(wire_values, e.scale, dtype)
        if dtype == torch.bool:  # normalise: any non-zero byte is True, never an invalid bool
            return torch.frombuffer(self._buf, dtype=torch.uint8, count=e.nbytes, offset=e.offset) != 0
        t = torch.frombuffer(self._buf, dtype=dtype, count=e.count, offset=e.offset)
        return t if t.data_ptr() % dtype.itemsize == 0 else t.clone()  # zero-copy view when aligned


async def assemble(
    frames: AsyncIterator[ReadFrame], assembler: MessageAssembler,
    paced: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[pb.TransferHeader, ModelMessage]:
    """Feed ``frames`` into ``assembler`` until the stream ends, and return the finished message.

    ``paced``: awaited for each chunk's bytes (a node's download cap). Both directions read to the end: a frame after
    the payload is refused (``trailing_data``), and a client
    leaves a call only at its status, never cancelling one whose server is ending it (that race makes gRPC's
    server log ``ExecuteBatchError``). The intake thread's work is awaited, never blocked on: the message is
    built there too, after the stream's chunks (one thread, in order), and a lossy payload decoded there.
    """
    async for frame in frames:
        assembler.feed(frame)
        if (behind := assembler.behind()) is not None:
            await asyncio.wrap_future(behind)
        if paced is not None and isinstance(frame, memoryview):
            await paced(frame.nbytes)  # a download cap: read on only as it allows (the sender waits meanwhile)
    assembler.ended()  # a truncated stream is refused now, before the await below (see ``ended``)
    return await asyncio.wrap_future(INTAKE.submit(assembler.finish))
