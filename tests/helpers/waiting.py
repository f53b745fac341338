"""Waiting in a test for what no event announces: :func:`until` on the running event loop's clock (virtual time
in the simulator), :func:`wait_for` blocking on the wall clock (processes: daemons, a verb). Both fail the test,
naming what they waited for, at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


async def until(condition: Callable[[], T], timeout: float = 20.0, what: str = "the condition") -> T:
    """Poll ``condition`` until it returns something truthy (returned), on the running loop's clock — virtual time
    in the simulator — failing the test with ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := condition()):
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


def wait_for(condition: Callable[[], T], timeout: float, what: str = "the condition") -> T:
    """:func:`until` for a test that waits outside an event loop (on processes: daemons, a verb), by the clock."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)
    return value
