"""Crash-safe checkpoints: two generations, verified on load, never a half-written model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dfl_node.errors import OperatorError
from dfl_node.node.model.persistence import MODEL_FILE, PREVIOUS, STATE_FILE, Checkpoint

FP = "fingerprint-a"


def _model(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 3), value), "b": torch.arange(3, dtype=torch.float32)}


def _two_generations(directory: Path) -> Checkpoint:
    checkpoint = Checkpoint(directory)
    checkpoint.save(_model(1.0), FP, {"round": 1})
    checkpoint.save(_model(2.0), FP, {"round": 2})
    return checkpoint


def _resumed(directory: Path) -> tuple[float, int]:
    model, state = Checkpoint(directory).load(FP)
    return float(model["w"][0, 0]), state["round"]


def test_the_newest_whole_checkpoint_is_loaded_and_only_two_are_kept(tmp_path: Path) -> None:
    checkpoint = _two_generations(tmp_path)
    checkpoint.save(_model(3.0), FP, {"round": 3})
    assert _resumed(tmp_path) == (3.0, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MODEL_FILE, STATE_FILE, *PREVIOUS.values()])
    fresh = Checkpoint(tmp_path)
    fresh.load(FP)
    fresh.save(_model(4.0), FP, {"round": 4})  # generations go on counting after a restart
    assert _resumed(tmp_path) == (4.0, 4) and json.loads((tmp_path / PREVIOUS[STATE_FILE]).read_text())["round"] == 3


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "empty", "non-finite", "state not JSON"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, damage: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    _two_generations(tmp_path)
    model = tmp_path / MODEL_FILE
    data = bytearray(model.read_bytes())
    if damage == "flip a byte":
        data[-5] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    elif damage == "non-finite":  # a whole file whose state names it, but whose weights are NaN
        checkpoint = Checkpoint(tmp_path / "other")
        checkpoint.save({"w": torch.full((4, 3), float("nan")), "b": torch.zeros(3)}, FP, {"round": 9})
        data = bytearray((tmp_path / "other" / MODEL_FILE).read_bytes())
        state = json.loads((tmp_path / STATE_FILE).read_text())
        (tmp_path / STATE_FILE).write_text(json.dumps({**state, **{k: v for k, v in json.loads(
            (tmp_path / "other" / STATE_FILE).read_text()).items() if k.startswith("checkpoint_model")}}))
    if damage == "state not JSON":
        (tmp_path / STATE_FILE).write_text('{"round": 2, "checkpoi')
    else:
        model.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert _resumed(tmp_path) == (1.0, 1)
    assert "resumed from checkpoint generation 1" in caplog.text


@pytest.mark.parametrize("cut_after", range(6))
def test_a_save_cut_short_at_any_rename_resumes_from_a_whole_pair(tmp_path: Path, cut_after: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A save's file-system steps after its files are written: the two old previous files unlinked, the current
    pair renamed to previous, the new pair renamed into place. The process dies before any one of them."""
    _two_generations(tmp_path)
    steps = 0
    real = {"rename": os.rename, "unlink": os.unlink}

    def crashing(name: str) -> Callable[..., None]:
        def step(*args: object, **kwargs: object) -> None:
            nonlocal steps
            if steps == cut_after:
                raise KeyboardInterrupt("kill -9")  # the process dies here: nothing after it happens
            steps += 1
            real[name](*args, **kwargs)
        return step

    for name in real:
        monkeypatch.setattr(os, name, crashing(name))
    with pytest.raises(KeyboardInterrupt):
        Checkpoint(tmp_path).save(_model(3.0), FP, {"round": 3})
    for name, function in real.items():
        monkeypatch.setattr(os, name, function)
    # the new pair is whole only once both renames into place are done: until then, the old pair (which a
    # cut between the first two renames leaves as state.json beside model.prev.safetensors)
    assert _resumed(tmp_path) == (2.0, 2)
    Checkpoint(tmp_path).save(_model(3.0), FP, {"round": 3})  # and the next save goes on from there
    assert _resumed(tmp_path) == (3.0, 3)


def test_nothing_that_verifies_is_an_operator_error_and_another_model_too(tmp_path: Path) -> None:
    _two_generations(tmp_path)
    for name in (MODEL_FILE, PREVIOUS[MODEL_FILE]):
        (tmp_path / name).write_bytes(b"\\x00" * 64)
    with pytest.raises(OperatorError, match="no checkpoint in .* verifies .*unreadable"):
        Checkpoint(tmp_path).load(FP)
    other = tmp_path / "other"
    _two_generations(other)
    with pytest.raises(OperatorError, match="holds another model"):
        Checkpoint(other).load("fingerprint-b")
    assert Checkpoint(tmp_path / "none").load(FP) is None


def test_a_state_naming_its_model_by_sha256_still_pairs(tmp_path: Path) -> None:
    """States written before BLAKE3 named the model file's sha256: a node upgraded in place resumes from them, and
    a sha256 that does not match its file still falls back to the previous pair."""
    _two_generations(tmp_path)
    assert "checkpoint_model_blake3" in json.loads((tmp_path / STATE_FILE).read_text())  # its wheel is a dependency
    for state_file, model_file in ((STATE_FILE, MODEL_FILE), (PREVIOUS[STATE_FILE], PREVIOUS[MODEL_FILE])):
        state = json.loads((tmp_path / state_file).read_text())
        del state["checkpoint_model_blake3"]
        state["checkpoint_model_sha256"] = hashlib.sha256((tmp_path / model_file).read_bytes()).hexdigest()
        (tmp_path / state_file).write_text(json.dumps(state))
    assert _resumed(tmp_path) == (2.0, 2)
    state = json.loads((tmp_path / STATE_FILE).read_text())
    (tmp_path / STATE_FILE).write_text(json.dumps({**state, "checkpoint_model_sha256": "0" * 64}))
    assert _resumed(tmp_path) == (1.0, 1)
