"""Generated gRPC modules for the wire protocol ``dfl.v1`` (source: ``proto/dfl/v1/dfl.proto``).

Do not edit ``dfl_pb2.py``, ``dfl_pb2_grpc.py`` or ``dfl_pb2.pyi``: change the proto and run
``python -m dfl_node.net.protogen``. Import what you need explicitly, e.g.
``from dfl_node.net.proto import dfl_pb2 as pb`` (the codec needs no grpc) and
``from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc`` (stubs and servicer).
"""
