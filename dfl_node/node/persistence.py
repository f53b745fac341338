"""Durable node state (design §4): the model and the node's counters, checkpointed atomically.

Each file is written to a temporary name, fsynced, renamed over the old one and the directory
fsynced, so a crash (even ``kill -9`` mid-write) leaves either the old or the new checkpoint,
never a torn one. The model is stored with safetensors — never pickle — so loading a checkpoint
cannot execute code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

MODEL_FILE, STATE_FILE = "model.safetensors", "state.json"


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


class Checkpoint:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

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
            raise ValueError(
                f"checkpoint {self.model_path} holds another model (fingerprint {saved}); "
                "use another --state-dir or remove it"
            )
        state_path = self.directory / STATE_FILE
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        return load_file(str(self.model_path)), state
