"""The output folder of a sweep: one ``<run name>.json`` per finished run, written atomically.

A file is written to a hidden temporary name and renamed into place, so a ``<run name>.json`` is
always whole: an interrupted sweep leaves finished runs and nothing half-written, and a sweep run
again treats a run as done exactly when its file exists and parses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dfl_node.results import RunResult
from dfl_node.sweep.grid import RunTask

_TMP_SUFFIX = ".tmp"


def result_path(out: Path, task: RunTask) -> Path:
    return out / f"{task.name}.json"


def read_result(path: Path) -> dict[str, Any] | None:
    """The run's JSON if the file exists and holds a complete run result, else None."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        RunResult.model_validate(payload)
    except (OSError, ValueError, ValidationError):
        return None
    return payload


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``path`` whole or not at all (temporary file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{_TMP_SUFFIX}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_leftovers(out: Path) -> None:
    """Temporary files of a sweep that was killed mid-write (SIGKILL, power loss)."""
    for tmp in out.glob(f".*.json.*{_TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
