"""How figures read for people: one way everywhere (``dfl-node status``, the node's log lines)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_accuracy", "format_bytes"]


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
