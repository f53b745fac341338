"""Durable node state: the model and the node's counters, checkpointed atomically, two generations kept.

A checkpoint is a pair: ``model.safetensors`` and ``state.json``, which names the digest of its model
file (BLAKE3, 3.5× as fast as sha256 here, where its wheel is installed; sha256 otherwise, and in states written
before) and a generation number. Saving writes both in full to temporary names (fsynced), moves the
current pair to ``*.prev.*`` and the new pair into place (the directory fsynced). Loading takes the
newest state whose model file is there *and verifies*: its digest, the architecture fingerprint, and
finite weights. So a crash at any point of a save (even ``kill -9`` between two renames), a torn or a
corrupted file, resumes from the newest checkpoint that is whole — never from a half-written model —
and says so in the log. The model is stored with safetensors — never pickle — so loading a
checkpoint cannot execute code.

One folder serves one node: :class:`~dfl_node.node.model.state_lock.StateLock` holds an exclusive lock on it for
the node's life, so a second node started on the same ``--state-dir`` stops instead of overwriting the first's
state.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load, save_file

from dfl_node.errors import OperatorError
from dfl_node.hashes import HASHES, OFFERED_HASHES
from dfl_node.learning.export import TrainedModel
from dfl_node.learning.models import ModelSpec
from dfl_node.node.model.served import Served
from dfl_node.node.model.state_lock import StateLock
from dfl_node.plugins import PluginError

log = logging.getLogger(__name__)

MODEL_FILE, STATE_FILE = "model.safetensors", "state.json"
PREVIOUS = {MODEL_FILE: "model.prev.safetensors", STATE_FILE: "state.prev.json"}
GENERATION = "checkpoint_generation"
# What a state file may name its model file's digest by, the preferred first: the hashes a transfer may carry
# (BLAKE3 where its wheel is installed; sha256 always, and in states written before BLAKE3).
FILE_DIGESTS = {f"checkpoint_model_{name}": HASHES[name] for name in OFFERED_HASHES}
CHECK_KEYS = (GENERATION, *FILE_DIGESTS)  # what a state file says of its model


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write(path: Path, data: bytes, fsync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def _digest(key: str, chunks: Iterable[bytes]) -> str:
    """The digest that state key ``key`` names, of ``chunks``."""
    digest = FILE_DIGESTS[key]()
    for chunk in chunks:
        digest.update(chunk)
    return digest.digest().hex()


class CheckpointError(ValueError):
    """A checkpoint file that does not verify (why, in one line)."""


class Checkpoint:
    """``fsync``: write through to the disk, so that a checkpoint survives a power cut, not only a crash of the
    process (whose writes the kernel keeps). Off only where that is the whole risk: the simulator's fleets,
    whose kill -9 is in-process, and whose time is virtual (a real fsync there costs wall time and proves
    nothing)."""

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        self.directory = directory
        self.fsync = fsync
        self.lock = StateLock(directory)
        self.generation: int | None = None  # of the newest checkpoint saved or loaded here (None: not looked yet)

    @property
    def model_path(self) -> Path:
        return self.directory / MODEL_FILE

    def save(self, model_state: dict[str, torch.Tensor], fingerprint: str, state: dict[str, Any],
             described: Mapping[str, str] | None = None) -> None:
        """``described``: metadata entries that say how to rebuild the served model (:mod:`.served`), so that
        ``dfl-node export`` reads it from the folder alone."""
        self.directory.mkdir(parents=True, exist_ok=True)
        # written straight to its file, not built as bytes first: that was a second copy of the model in memory
        save_file({k: v.detach().contiguous() for k, v in model_state.items()},
                  str(self.directory / f".{MODEL_FILE}.tmp"),
                  metadata={**(described or {}), "fingerprint": fingerprint})
        named_by = next(iter(FILE_DIGESTS))
        with open(self.directory / f".{MODEL_FILE}.tmp", "rb") as written:
            model_digest = _digest(named_by, iter(lambda: written.read(1 << 20), b""))  # never whole in memory
            if self.fsync:
                os.fsync(written.fileno())
        self.generation = (self._newest_generation() if self.generation is None else self.generation) + 1
        check = {GENERATION: self.generation, named_by: model_digest}
        _write(self.directory / f".{STATE_FILE}.tmp", json.dumps({**state, **check}).encode(), self.fsync)
        staged = (MODEL_FILE, STATE_FILE)
        for name in staged:  # the current pair becomes the previous one …
            if (self.directory / name).exists():
                # the old previous file goes first: a rename over an existing file makes ext4 write the renamed
                # file's data out at once (auto_da_alloc), 1.6 ms a save here; never is there no pair to load
                (self.directory / PREVIOUS[name]).unlink(missing_ok=True)
                os.rename(self.directory / name, self.directory / PREVIOUS[name])
        for name in staged:  # … and the new pair the current one
            os.rename(self.directory / f".{name}.tmp", self.directory / name)
        if self.fsync:
            _fsync_dir(self.directory)

    def _newest_generation(self) -> int:
        """The highest generation a state file here names (0: none), so that a save never goes back in time."""
        newest = 0
        for name in (STATE_FILE, PREVIOUS[STATE_FILE]):
            try:
                newest = max(newest, int(json.loads((self.directory / name).read_bytes()).get(GENERATION, 0)))
            except (OSError, ValueError, AttributeError, TypeError):
                continue
        return newest

    def load(self, fingerprint: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The newest saved model and state that verify, or None if there is none. A checkpoint of another
        model, or files none of which verify, is an :class:`OperatorError`: a node never resumes from them."""
        models = [self.directory / n for n in (MODEL_FILE, PREVIOUS[MODEL_FILE]) if (self.directory / n).is_file()]
        if not models:
            return None
        states, problems = [], []
        for name in (STATE_FILE, PREVIOUS[STATE_FILE]):
            path = self.directory / name
            try:
                state = json.loads(path.read_bytes()) if path.is_file() else None
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(f"{name}: not JSON ({str(exc)[:80]})")
                continue
            if isinstance(state, dict):
                states.append((name, state))
        if not states and not problems:
            states.append((STATE_FILE, {}))  # a model without its state file: the node's counters start afresh
        checked: dict[str, tuple[dict[str, str], dict[str, torch.Tensor] | CheckpointError]] = {}
        named = {k for _, state in states for k in FILE_DIGESTS if k in state}  # the digests worth computing
        for state_name, state in sorted(states, key=lambda item: -int(item[1].get(GENERATION, 0))):
            # (a state whose digest this node cannot compute, BLAKE3 without its wheel, pairs as one that names none)
            key = next((k for k in FILE_DIGESTS if k in state), None)
            for path in models:  # a crash between two renames can leave a state beside its model's new name
                if key is None and path.name != MODEL_FILE:
                    continue  # a state written before checkpoints named their model pairs with the current one
                if path.name not in checked:
                    checked[path.name] = _verified(path, fingerprint, named)
                digests, tensors = checked[path.name]
                if isinstance(tensors, dict) and (key is None or digests[key] == state[key]):
                    self.generation = int(state.get(GENERATION, 0))
                    refused = problems + [str(t) for _, t in checked.values() if isinstance(t, CheckpointError)]
                    if refused or (state_name, path.name) != (STATE_FILE, MODEL_FILE):
                        log.warning("%s: resumed from checkpoint generation %d (%s, %s); newer files do not verify: %s",
                                    self.directory, self.generation, path.name, state_name,
                                    "; ".join(refused) or "a save was cut short")
                    return tensors, {k: v for k, v in state.items() if k not in CHECK_KEYS}
        problems += [str(t) for _, t in checked.values() if isinstance(t, CheckpointError)]
        raise OperatorError(f"no checkpoint in {self.directory} verifies ({'; '.join(problems) or 'no model matches'}"
                            "); move the folder away to start afresh")


def _verified(path: Path, fingerprint: str, keys: Iterable[str]) -> tuple[dict[str, str],
                                                                          dict[str, torch.Tensor] | CheckpointError]:
    """Model file ``path``'s digests by the state ``keys`` that name them, and its tensors if it is whole and
    finite, else why not; another architecture's checkpoint is an :class:`OperatorError` (the operator pointed at
    the wrong folder)."""
    data = path.read_bytes()
    digests = {key: _digest(key, (data,)) for key in keys}
    try:
        with safe_open(str(path), framework="pt") as f:
            saved = (f.metadata() or {}).get("fingerprint")
        tensors = load(data)
    except (SafetensorError, OSError, ValueError) as exc:
        return digests, CheckpointError(f"{path.name}: unreadable ({str(exc)[:120]})")
    if saved != fingerprint:
        raise OperatorError(f"checkpoint {path} holds another model (fingerprint {saved}); "
                            "use another --state-dir or remove it")
    if not all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point()):
        return digests, CheckpointError(f"{path.name}: non-finite weights")
    return digests, tensors


def read_trained(directory: Path) -> TrainedModel:
    """The model a node's state folder serves (:mod:`.served`), from its newest checkpoint that verifies, as
    ``dfl-node export`` reads it: while its node runs too (a checkpoint is only ever replaced whole). A folder
    without a checkpoint, or with one from before checkpoints described their model, is an :class:`OperatorError`.

    The folder is the operator's own node's, so its spec is that node's configuration, not a peer's word: a
    ``package.module:factory`` in it is imported here from PYTHONPATH, as ``dfl-node start`` imported it (one that
    cannot be is the one-line :class:`~dfl_node.plugins.PluginError`); a model this installation cannot build,
    such as a plugin not installed here, is an :class:`OperatorError`."""
    metadata = None
    for name in (MODEL_FILE, PREVIOUS[MODEL_FILE]):  # the newest readable header says what the folder holds
        try:
            with safe_open(str(directory / name), framework="pt") as f:
                metadata = f.metadata() or {}
            break
        except (SafetensorError, OSError, ValueError):
            continue
    if metadata is None:
        raise OperatorError(f"{directory} holds no readable checkpoint ({MODEL_FILE}): is it a node's --state-dir?")
    served = Served.from_metadata(metadata, str(directory / MODEL_FILE))
    try:
        ModelSpec.parse(served.spec, configured=True)
    except PluginError:
        raise
    except ValueError as exc:
        raise OperatorError(f"{directory / MODEL_FILE}: this installation cannot build its model ({exc})") from None
    return load_served(directory, served, metadata.get("fingerprint", ""))


def load_served(directory: Path, served: Served, fingerprint: str) -> TrainedModel:
    """``served``, the model of the newest checkpoint in ``directory`` that verifies (of ``fingerprint``); none
    there is an :class:`OperatorError`."""
    saved = Checkpoint(directory).load(fingerprint)
    if saved is None:
        raise OperatorError(f"{directory} holds no checkpoint ({MODEL_FILE})")
    tensors, durable = saved
    return served.trained(tensors, int(durable.get("round", 0)), copy=False)
