"""One folder serves one node: :class:`StateLock`, held for the node's life, and read by ``dfl-node stop``
(apart from the checkpoints, so that stopping a node imports neither torch nor the node)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dfl_node.errors import OperatorError

LOCK_FILE = "lock"


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

    @staticmethod
    def holder(directory: Path) -> int | None:
        """The pid of the node running in ``directory`` now, or None if none is (the lock is free: a crashed
        node's pid left in the file does not count)."""
        try:
            fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        finally:
            os.close(fd)  # also drops the shared lock, if we got it
        return None

    def release(self) -> None:
        """Drop the lock (idempotent); closing the descriptor is what releases a flock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
