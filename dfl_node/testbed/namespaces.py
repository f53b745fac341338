"""Running inside a named network namespace (``ip netns add NAME``): a command, or a function of this process.

A testbed's nodes live in namespaces whose addresses the driver cannot reach from its own. Their daemons are
started with ``ip netns exec``; the driver's polls of their REST APIs run in a thread that has entered the
namespace (setns(2) moves the calling thread only) and ends with the call, rather than in a Python process
started for each poll (~0.35 s of CPU apiece, two a second, taken from the fleet under test).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["inside", "run_inside"]

T = TypeVar("T")
_CLONE_NEWNET = 0x40000000  # <sched.h>: setns(2)'s namespace type (os.setns and os.CLONE_NEWNET: Python 3.12)


def inside(namespace: str | None, argv: list[str]) -> list[str]:
    """``argv`` run inside ``namespace`` (``ip netns exec`` execs it: same pid); as it is without one."""
    return ["ip", "netns", "exec", namespace, *argv] if namespace else argv


def _enter(namespace: str) -> None:
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"cannot enter network namespace {namespace}: {os.strerror(error)}")
    finally:
        os.close(fd)


def _entered(namespace: str, function: Callable[..., T], *args: object) -> T:
    _enter(namespace)
    return function(*args)


def run_inside(namespace: str | None, function: Callable[..., T], *args: object) -> T:
    """``function(*args)`` with every socket it opens in ``namespace`` (needs CAP_SYS_ADMIN, as ``ip netns exec``
    does): on a thread of its own that enters it and ends with the call; in this thread without a namespace."""
    if namespace is None:
        return function(*args)
    with ThreadPoolExecutor(1, thread_name_prefix=f"netns-{namespace}") as pool:
        return pool.submit(_entered, namespace, function, *args).result()
