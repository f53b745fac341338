"""How figures read for people: one way everywhere (``dfl-node status``, the node's log lines)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_accuracy", "format_bytes", "format_data"]


def format_accuracy(value: Any) -> str:
    """``0.9123`` as ``91.23%``; ``–`` while there is none."""
    return "–" if value is None else f"{100 * float(value):.2f}%"


def format_bytes(n: Any) -> str:
    """Binary units, one decimal (``1.5 MiB``); ``–`` while there is none."""
    if n is None:
        return "–"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{int(x)} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    raise AssertionError("unreachable")


def format_data(data: Any) -> str | None:
    """A node's data (``/status``'s ``data``) in a line: ``240 + 60 samples (train + val), 3 files, 1 bad file``."""
    if not isinstance(data, dict):
        return None
    files, bad = data.get("files"), data.get("bad_files") or 0
    return (f"{data.get('train_samples')} + {data.get('val_samples')} samples (train + val), {files} "
            f"file{'' if files == 1 else 's'}" + (f", {bad} bad file{'' if bad == 1 else 's'}" if bad else ""))
