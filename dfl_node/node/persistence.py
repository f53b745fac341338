"""Durable node state: the model and the node's counters, checkpointed atomically.

Each file is written to a temporary name, fsynced, renamed over the old one and the directory
fsynced, so a crash (even ``kill -9`` mid-write) leaves either the old or the new checkpoint,
never a torn one. The model is stored with safetensors — never pickle — so loading a checkpoint
cannot execute code.

One folder serves one node: :class:`StateLock` holds an exclusive lock on it for the node's life,
so a second node started on the same ``--state-dir`` stops instead of overwriting the first's state.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dfl_node.config import OperatorError

MODEL_FILE, STATE_FILE, LOCK_FILE = "model.safetensors", "state.json", "lock"


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateLock:
    """An exclusive ``flock`` on ``<state dir>/lock`` that holds the node's pid.

    flock rather than a pid file: the kernel drops the lock when the process dies, even by
    ``kill -9``, so a crashed node never leaves a stale lock that blocks its restart. The file is
    never removed (removing it would let two nodes lock two different files of the same name).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`OperatorError` naming the pid that holds it; never waits."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OperatorError(f"state dir {self.directory} is in use by another running node (pid {holder}); "
                                "give each node its own --state-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent); closing the descriptor is what releases a flock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Checkpoint:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lock = StateLock(directory)

    @property
    def model_path(self) -> Path:
        return self.directory / MODEL_FILE

    def save(self, model_state: dict[str, torch.Tensor], fingerprint: str, state: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous() for k, v in model_state.items()}
        _atomic_write(self.model_path, lambda p: save_file(tensors, str(p), metadata={"fingerprint": fingerprint}))
        _atomic_write(self.directory / STATE_FILE, lambda p: p.write_text(json.dumps(state)))

    def load(self, fingerprint: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The saved model and state, or None if there is none; a checkpoint of another model is an error."""
        if not self.model_path.is_file():
            return None
        with safe_open(str(self.model_path), framework="pt") as f:
            saved = (f.metadata() or {}).get("fingerprint")
        if saved != fingerprint:
            raise OperatorError(
                f"checkpoint {self.model_path} holds another model (fingerprint {saved}); "
                "use another --state-dir or remove it"
            )
        state_path = self.directory / STATE_FILE
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        return load_file(str(self.model_path)), state
