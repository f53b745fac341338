"""The committed gRPC modules are exactly what protoc makes of proto/dfl/v1/dfl.proto."""

from __future__ import annotations

import importlib
from pathlib import Path

import grpc_tools  # noqa: F401  (dev extra: the generator must be installed to check its output)

from dfl_node.net import protogen  # noqa: E402


def test_committed_modules_equal_fresh_generation(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(protogen.GENERATED)
    for path in written:
        committed = protogen.PACKAGE_DIR / path.name
        assert committed.is_file(), f"{committed} is missing: run python -m dfl_node.net.protogen"
        assert committed.read_bytes() == path.read_bytes(), f"{committed} is stale: run python -m dfl_node.net.protogen"


def test_check_mode_detects_a_stale_module(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    assert protogen.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "dfl_pb2_grpc.py").write_text("# edited by hand\n")
    assert protogen.main(["--check", "--out", str(tmp_path)]) == 1


def test_generated_modules_import_inside_the_package() -> None:
    pb = importlib.import_module("dfl_node.net.proto.dfl_pb2")
    pb_grpc = importlib.import_module("dfl_node.net.proto.dfl_pb2_grpc")
    service = pb.DESCRIPTOR.services_by_name["DflNode"]
    assert service.full_name == "dfl.v1.DflNode"
    assert {m.name for m in service.methods} == {"Hello", "Transfer", "Assign", "PassToken", "Pull", "Probe", "Ping",
                                                    "DialBack", "Reserve", "Control"}
    transfer = service.methods_by_name["Transfer"]
    assert transfer.client_streaming and transfer.server_streaming
    assert pb_grpc.dfl__node_dot_net_dot_proto_dot_dfl__pb2 is pb  # the grpc module uses the package's pb2
    assert hasattr(pb_grpc, "DflNodeStub") and hasattr(pb_grpc, "add_DflNodeServicer_to_server")
