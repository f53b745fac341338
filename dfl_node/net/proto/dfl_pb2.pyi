from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControlEnvelope(_message.Message):
    __slots__ = ("kind", "body")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    kind: str
    body: bytes
    def __init__(self, kind: _Optional[str] = ..., body: _Optional[bytes] = ...) -> None: ...

class DialBackRequest(_message.Message):
    __slots__ = ("sender", "address", "timeout_s")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    sender: str
    address: str
    timeout_s: float
    def __init__(self, sender: _Optional[str] = ..., address: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("sender", "swarm")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    sender: str
    swarm: str
    def __init__(self, sender: _Optional[str] = ..., swarm: _Optional[str] = ...) -> None: ...

class RelayEvent(_message.Message):
    __slots__ = ("address", "token", "heartbeat_s", "reason", "relay")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    address: str
    token: bytes
    heartbeat_s: float
    reason: str
    relay: str
    def __init__(self, address: _Optional[str] = ..., token: _Optional[bytes] = ..., heartbeat_s: _Optional[float] = ..., reason: _Optional[str] = ..., relay: _Optional[str] = ...) -> None: ...

class MemberUpdate(_message.Message):
    __slots__ = ("state", "incarnation", "node_id", "sender", "hello")
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    state: str
    incarnation: int
    node_id: str
    sender: str
    hello: HelloRequest
    def __init__(self, state: _Optional[str] = ..., incarnation: _Optional[int] = ..., node_id: _Optional[str] = ..., sender: _Optional[str] = ..., hello: _Optional[_Union[HelloRequest, _Mapping]] = ...) -> None: ...

class MembershipPing(_message.Message):
    __slots__ = ("sender", "target", "target_address", "timeout_s", "sync", "updates")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    sender: str
    target: str
    target_address: str
    timeout_s: float
    sync: bool
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, sender: _Optional[str] = ..., target: _Optional[str] = ..., target_address: _Optional[str] = ..., timeout_s: _Optional[float] = ..., sync: _Optional[bool] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class MembershipAck(_message.Message):
    __slots__ = ("ok", "updates")
    OK_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, ok: _Optional[bool] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("protocol_version", "swarm", "node_id", "fingerprint", "algorithm", "boot_id", "grpc_address", "http_port", "status_url", "model", "num_samples", "wire_dtype", "hashes", "progress", "sample_shape", "num_classes", "work_s", "relay", "direct", "task")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_PORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    WORK_S_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    swarm: str
    node_id: str
    fingerprint: str
    algorithm: str
    boot_id: str
    grpc_address: str
    http_port: int
    status_url: str
    model: str
    num_samples: int
    wire_dtype: str
    hashes: _containers.RepeatedScalarFieldContainer[str]
    progress: RoundProgress
    sample_shape: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    work_s: float
    relay: str
    direct: bool
    task: str
    def __init__(self, protocol_version: _Optional[int] = ..., swarm: _Optional[str] = ..., node_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., algorithm: _Optional[str] = ..., boot_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., http_port: _Optional[int] = ..., status_url: _Optional[str] = ..., model: _Optional[str] = ..., num_samples: _Optional[int] = ..., wire_dtype: _Optional[str] = ..., hashes: _Optional[_Iterable[str]] = ..., progress: _Optional[_Union[RoundProgress, _Mapping]] = ..., sample_shape: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., work_s: _Optional[float] = ..., relay: _Optional[str] = ..., direct: _Optional[bool] = ..., task: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol_version", "swarm", "node_id", "fingerprint", "algorithm", "boot_id", "grpc_address", "http_port", "accepted", "reason", "status_url", "model", "num_samples", "progress", "wire_dtype", "hashes", "sample_shape", "num_classes", "work_s", "relay", "direct", "task")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_PORT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    WORK_S_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    swarm: str
    node_id: str
    fingerprint: str
    algorithm: str
    boot_id: str
    grpc_address: str
    http_port: int
    accepted: bool
    reason: str
    status_url: str
    model: str
    num_samples: int
    progress: RoundProgress
    wire_dtype: str
    hashes: _containers.RepeatedScalarFieldContainer[str]
    sample_shape: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    work_s: float
    relay: str
    direct: bool
    task: str
    def __init__(self, protocol_version: _Optional[int] = ..., swarm: _Optional[str] = ..., node_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., algorithm: _Optional[str] = ..., boot_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., http_port: _Optional[int] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., status_url: _Optional[str] = ..., model: _Optional[str] = ..., num_samples: _Optional[int] = ..., progress: _Optional[_Union[RoundProgress, _Mapping]] = ..., wire_dtype: _Optional[str] = ..., hashes: _Optional[_Iterable[str]] = ..., sample_shape: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., work_s: _Optional[float] = ..., relay: _Optional[str] = ..., direct: _Optional[bool] = ..., task: _Optional[str] = ...) -> None: ...

class TensorEntry(_message.Message):
    __slots__ = ("name", "dtype", "shape", "start", "count", "offset", "nbytes", "encoding", "scale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    start: int
    count: int
    offset: int
    nbytes: int
    encoding: str
    scale: float
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., start: _Optional[int] = ..., count: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ..., encoding: _Optional[str] = ..., scale: _Optional[float] = ...) -> None: ...

class TransferHeader(_message.Message):
    __slots__ = ("sender", "swarm", "protocol_version", "round", "purpose", "fingerprint", "manifest", "total_size", "digest", "hash", "num_samples", "metadata", "epoch", "model", "resume", "start", "reply_digest", "reply_offset", "chunk_size")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    REPLY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    sender: str
    swarm: str
    protocol_version: int
    round: int
    purpose: str
    fingerprint: str
    manifest: _containers.RepeatedCompositeFieldContainer[TensorEntry]
    total_size: int
    digest: bytes
    hash: str
    num_samples: int
    metadata: _containers.ScalarMap[str, str]
    epoch: int
    model: str
    resume: bool
    start: int
    reply_digest: bytes
    reply_offset: int
    chunk_size: int
    def __init__(self, sender: _Optional[str] = ..., swarm: _Optional[str] = ..., protocol_version: _Optional[int] = ..., round: _Optional[int] = ..., purpose: _Optional[str] = ..., fingerprint: _Optional[str] = ..., manifest: _Optional[_Iterable[_Union[TensorEntry, _Mapping]]] = ..., total_size: _Optional[int] = ..., digest: _Optional[bytes] = ..., hash: _Optional[str] = ..., num_samples: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., epoch: _Optional[int] = ..., model: _Optional[str] = ..., resume: _Optional[bool] = ..., start: _Optional[int] = ..., reply_digest: _Optional[bytes] = ..., reply_offset: _Optional[int] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class TransferResult(_message.Message):
    __slots__ = ("accepted", "reason", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ResumeAt(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("header", "chunk", "result", "resume")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    header: TransferHeader
    chunk: Chunk
    result: TransferResult
    resume: ResumeAt
    def __init__(self, header: _Optional[_Union[TransferHeader, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., result: _Optional[_Union[TransferResult, _Mapping]] = ..., resume: _Optional[_Union[ResumeAt, _Mapping]] = ...) -> None: ...

class RoundToken(_message.Message):
    __slots__ = ("round", "epoch", "holder", "seed", "state", "members", "done")
    class StateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    round: int
    epoch: int
    holder: str
    seed: int
    state: _containers.ScalarMap[str, str]
    members: _containers.RepeatedScalarFieldContainer[str]
    done: bool
    def __init__(self, round: _Optional[int] = ..., epoch: _Optional[int] = ..., holder: _Optional[str] = ..., seed: _Optional[int] = ..., state: _Optional[_Mapping[str, str]] = ..., members: _Optional[_Iterable[str]] = ..., done: _Optional[bool] = ...) -> None: ...

class RoundAssignment(_message.Message):
    __slots__ = ("round", "epoch", "holder", "role", "aggregator", "aggregator_address", "state", "senders", "pull", "deadline_s", "candidates", "addresses")
    class StateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    AGGREGATOR_FIELD_NUMBER: _ClassVar[int]
    AGGREGATOR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SENDERS_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    round: int
    epoch: int
    holder: str
    role: str
    aggregator: str
    aggregator_address: str
    state: _containers.ScalarMap[str, str]
    senders: _containers.RepeatedScalarFieldContainer[str]
    pull: bool
    deadline_s: float
    candidates: _containers.RepeatedScalarFieldContainer[str]
    addresses: _containers.ScalarMap[str, str]
    def __init__(self, round: _Optional[int] = ..., epoch: _Optional[int] = ..., holder: _Optional[str] = ..., role: _Optional[str] = ..., aggregator: _Optional[str] = ..., aggregator_address: _Optional[str] = ..., state: _Optional[_Mapping[str, str]] = ..., senders: _Optional[_Iterable[str]] = ..., pull: _Optional[bool] = ..., deadline_s: _Optional[float] = ..., candidates: _Optional[_Iterable[str]] = ..., addresses: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("aggregator", "swarm", "round", "epoch", "state", "hashes", "digest", "offset", "chunk_size")
    class StateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGGREGATOR_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    aggregator: str
    swarm: str
    round: int
    epoch: int
    state: _containers.ScalarMap[str, str]
    hashes: _containers.RepeatedScalarFieldContainer[str]
    digest: bytes
    offset: int
    chunk_size: int
    def __init__(self, aggregator: _Optional[str] = ..., swarm: _Optional[str] = ..., round: _Optional[int] = ..., epoch: _Optional[int] = ..., state: _Optional[_Mapping[str, str]] = ..., hashes: _Optional[_Iterable[str]] = ..., digest: _Optional[bytes] = ..., offset: _Optional[int] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("sender", "swarm", "round", "epoch", "mode", "dtype", "shape", "samples", "labels")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    swarm: str
    round: int
    epoch: int
    mode: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    samples: bytes
    labels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sender: _Optional[str] = ..., swarm: _Optional[str] = ..., round: _Optional[int] = ..., epoch: _Optional[int] = ..., mode: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., samples: _Optional[bytes] = ..., labels: _Optional[_Iterable[int]] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("ok", "reason", "samples", "correct", "loss", "class_accuracy")
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    CLASS_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    reason: str
    samples: int
    correct: int
    loss: float
    class_accuracy: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ok: _Optional[bool] = ..., reason: _Optional[str] = ..., samples: _Optional[int] = ..., correct: _Optional[int] = ..., loss: _Optional[float] = ..., class_accuracy: _Optional[_Iterable[float]] = ...) -> None: ...

class RoundProgress(_message.Message):
    __slots__ = ("round", "epoch", "holding", "done", "state", "busy", "role", "local_accuracy", "global_accuracy")
    class StateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOLDING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    round: int
    epoch: int
    holding: bool
    done: bool
    state: _containers.ScalarMap[str, str]
    busy: bool
    role: str
    local_accuracy: float
    global_accuracy: float
    def __init__(self, round: _Optional[int] = ..., epoch: _Optional[int] = ..., holding: _Optional[bool] = ..., done: _Optional[bool] = ..., state: _Optional[_Mapping[str, str]] = ..., busy: _Optional[bool] = ..., role: _Optional[str] = ..., local_accuracy: _Optional[float] = ..., global_accuracy: _Optional[float] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ok", "reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    reason: str
    def __init__(self, ok: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...
