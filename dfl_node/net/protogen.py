"""Regenerate the gRPC modules in ``dfl_node/net/proto/`` from ``proto/dfl/v1/dfl.proto``.

    python -m dfl_node.net.protogen            # rewrite the committed modules
    python -m dfl_node.net.protogen --check    # exit 1 if they differ from a fresh generation

protoc sees the proto under the *virtual* path ``dfl_node/net/proto/dfl.proto`` (``-Ivirtual=physical``),
so the generated ``dfl_pb2_grpc.py`` says ``from dfl_node.net.proto import dfl_pb2`` — the right
import inside this package, with no post-processing. The protobuf package stays ``dfl.v1``, so the
service's wire name is ``/dfl.v1.DflNode/...``. Output depends only on the proto text and the
grpcio-tools version (pinned in pyproject), so ``tests/test_protogen.py`` can demand byte equality.
Needs the ``dev`` extra (grpcio-tools) and a source checkout (``proto/`` is not installed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PROTO_FILE = Path(__file__).resolve().parents[2] / "proto" / "dfl" / "v1" / "dfl.proto"
PACKAGE_DIR = Path(__file__).resolve().parent / "proto"
VIRTUAL_PATH = "dfl_node/net/proto/dfl.proto"
GENERATED = ("dfl_pb2.py", "dfl_pb2_grpc.py", "dfl_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on the proto and write the generated modules (flat) into ``out_dir``; return their paths."""
    from grpc_tools import protoc  # dev-only dependency, imported lazily

    if not PROTO_FILE.is_file():
        raise FileNotFoundError(f"{PROTO_FILE} not found: protogen needs a source checkout")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{VIRTUAL_PATH}={PROTO_FILE}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                VIRTUAL_PATH,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        written = []
        for name in GENERATED:
            target = out_dir / name
            target.write_bytes((Path(tmp) / Path(VIRTUAL_PATH).parent / name).read_bytes())
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dfl_node.net.protogen", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR, help="output folder (default: the package)")
    parser.add_argument("--check", action="store_true", help="only compare with --out; exit 1 on a difference")
    args = parser.parse_args(argv)
    if not args.check:
        for path in generate(args.out):
            print(f"wrote {path}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = [
            p.name for p in generate(Path(tmp))
            if not (args.out / p.name).is_file() or (args.out / p.name).read_bytes() != p.read_bytes()
        ]
    for name in stale:
        print(f"stale: {args.out / name}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
