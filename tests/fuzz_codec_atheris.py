"""Coverage-guided fuzzing of the Transfer codec with atheris (libFuzzer), next to the hypothesis suite.

Run: ``python -m tests.fuzz_codec_atheris CORPUS_DIR -runs=N`` (libFuzzer flags). ``--seed-corpus DIR``
writes valid transfers to start from (mutations of valid input reach far deeper than random bytes).

One input is a list of frames, each a 2-byte little-endian length and that many bytes, fed to a
fresh :class:`MessageAssembler` exactly as a node's server feeds a Transfer stream (every frame
through :func:`decode_frame`). The first byte says whether the harness fixes the header's digest up
to match the payload first: without it almost every mutation dies at the checksum, with it the
fuzzer reaches the manifest, offsets and tensor building behind it.

A crash is anything but a :class:`TransferRejected`, or an accepted message that does not fit the
receiver's manifest (name, shape, dtype, finite count): libFuzzer then stops and exits non-zero.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from pathlib import Path

import atheris
import torch  # noqa: F401  imported before instrumenting: coverage of our wire code only

with atheris.instrument_imports(include=["dfl_node.net"]):
    from dfl_node.net.assembler import MessageAssembler
    from dfl_node.net.frames import decode_frame
    from dfl_node.net.manifest import manifest_of
    from dfl_node.net.proto import dfl_pb2 as pb
    from dfl_node.peering.errors import TransferRejected

from tests.helpers.codec import FP, SWARM, encoded_frames, make_msg, make_state  # noqa: E402  after instrumenting

STATE = make_state()
MANIFEST = manifest_of(STATE)


def split_frames(data: bytes) -> list[bytes]:
    """The frames of one input (a truncated last length or frame ends the list)."""
    frames, pos = [], 0
    while pos + 2 <= len(data):
        (size,) = struct.unpack_from("<H", data, pos)
        frames.append(data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    return frames


def join_frames(frames: list[bytes], fix_sha: bool) -> bytes:
    return bytes([fix_sha]) + b"".join(struct.pack("<H", len(f)) + f for f in frames)


def _fixed_sha(raw_frames: list[bytes]) -> list[bytes]:
    """The frames with the header's digest (sha256) set to that of the chunks' payload (what a sender would send)."""
    decoded = [decode_frame(raw) for raw in raw_frames]
    payload = b"".join(bytes(f) for f in decoded if isinstance(f, memoryview))
    out = []
    for raw, frame in zip(raw_frames, decoded):
        if isinstance(frame, pb.Frame) and frame.WhichOneof("kind") == "header":
            frame.header.digest = hashlib.sha256(payload).digest()
            raw = frame.SerializeToString()
        out.append(raw)
    return out


def one_input(data: bytes) -> None:
    if not data:
        return
    raw_frames = split_frames(data[1:])
    if data[0] & 1:
        raw_frames = _fixed_sha(raw_frames)
    assembler = MessageAssembler(swarm=SWARM, fingerprint=FP, manifest=MANIFEST)
    try:
        for raw in raw_frames:
            assembler.feed(decode_frame(raw))
        _, message = assembler.finish()
    except TransferRejected:
        return
    for part in message.parts:  # accepted: it must fit the receiver's model exactly
        dtype, shape = MANIFEST[part.name]
        numel = 1
        for n in shape:
            numel *= n
        if part.shape != shape or part.values.dtype != dtype or part.start + part.values.numel() > numel:
            raise AssertionError(f"accepted a part that does not fit: {part.name} {part.shape} {part.values.dtype}")


def write_seed_corpus(folder: Path) -> None:
    """Valid transfers (one chunk, many small chunks; a partial message) to mutate from."""
    folder.mkdir(parents=True, exist_ok=True)
    full = make_msg()
    seeds = {"one-chunk": encoded_frames(full), "small-chunks": encoded_frames(full, chunk_size=256),
             "partial": encoded_frames(make_msg({k: STATE[k] for k in ("conv.bias", "mask")}), chunk_size=64)}
    for name, frames in seeds.items():
        for fix in (0, 1):
            (folder / f"{name}-{fix}").write_bytes(join_frames(frames, bool(fix)))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--seed-corpus":
        write_seed_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
