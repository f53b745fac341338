"""The figures each fuzz file reports and checks ("Hostile input"): malformed inputs tried, by
where they went in; crashes; received pickles unpickled; RSS and open file descriptors before its first
case and after its last.

The suite must try at least :data:`MIN_INPUTS` malformed inputs. The suite is two files (the codec
in-process, the RPCs of a real node), each of which can run alone, so each prints its own figures and
checks its own share of the minimum: the two shares add up to :data:`MIN_INPUTS`.

A file's figures test checks totals that its flood tests accumulate, so it must not depend on them
having run before it in the same process: selected alone (``-k``), in another order or after a
failure, it would see no inputs tried and fail. Flood tests are marked with :meth:`Figures.flood`,
and the figures test calls :meth:`Figures.complete` first, which runs (the same derandomized cases)
those that have not run in this process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz_strategies import DETONATED

MIN_INPUTS = 10_000
MIN_GRPC_INPUTS = 1_500  # test_fuzz_grpc.py's share: it tries ~2,000, each a round trip to a real node
MIN_CODEC_INPUTS = MIN_INPUTS - MIN_GRPC_INPUTS  # test_fuzz_codec.py's share: it tries 9,100


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class ErrorLog(logging.Handler):
    """ERROR records (or tracebacks) of the node or gRPC: a crash of a handler that the client might not see."""

    def __init__(self, crashes: list[str]) -> None:
        super().__init__()
        self.crashes = crashes

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.crashes.append(f"log: {record.name}: {record.getMessage()[:300]}")


@dataclass
class Figures:
    """One fuzz file's figures: what it tried and what went wrong, against baselines taken before its first case."""

    title: str
    minimum: int  # the file's share of MIN_INPUTS
    tried: Counter[str] = field(default_factory=Counter)  # malformed inputs tried, by where they went in
    crashes: list[str] = field(default_factory=list)  # anything but a refusal with a reason (exception, status, log)
    rss: float = 0.0  # MB, at the baseline
    fds: int = 0  # open file descriptors, at the baseline
    floods: dict[str, Callable[..., None]] = field(default_factory=dict)  # the file's flood tests, by name
    flooded: set[str] = field(default_factory=set)  # those that ran all their cases in this process

    def flood(self, test: Callable[..., None]) -> Callable[..., None]:
        """Decorator (outermost, above hypothesis's): ``test`` is part of the flood this file's figures
        report on; it is recorded once all its cases have run, so :meth:`complete` knows what is missing."""
        @functools.wraps(test)  # keeps hypothesis's attributes and the signature pytest reads fixtures from
        def run(*args: object, **kwargs: object) -> None:
            test(*args, **kwargs)
            self.flooded.add(test.__name__)

        self.floods[test.__name__] = run
        return run

    def complete(self, **fixtures: object) -> None:
        """Run the flood tests that have not run in this process (deselected, or ordered after the figures
        test), with ``fixtures`` as their arguments: the figures are then always the whole file's."""
        for name, run in self.floods.items():
            if name not in self.flooded:
                run(**fixtures)

    def count(self, surface: str, n: int = 1) -> None:
        self.tried[surface] += n

    def take_baseline(self) -> None:
        """RSS and open fds now, before the file's first case, which the flood must leave bounded."""
        self.rss, self.fds = rss_mb(), open_fds()

    @contextlib.contextmanager
    def errors_logged(self) -> Iterator[None]:
        """Within the block, every ERROR log record (or traceback) is a crash."""
        errors = ErrorLog(self.crashes)
        logging.getLogger().addHandler(errors)
        try:
            yield
        finally:
            logging.getLogger().removeHandler(errors)

    def report(self, rss: float, fds: int, extra: dict[str, object] | None = None) -> None:
        """Print the figures (``rss`` and ``fds``: measured after the flood; ``extra``: the file's own, by
        name) and check the ones every file shares: its share of the inputs tried, no crash, nothing
        unpickled, RSS and fds bounded. Run with ``-s`` to see them."""
        total = sum(self.tried.values())
        print(f"\n---- fuzz figures: {self.title} ----")
        for surface, n in sorted(self.tried.items()):
            print(f"  {surface:<32} {n:>6}")
        print(f"malformed inputs tried {total} (this file's share of the {MIN_INPUTS}: at least {self.minimum})")
        print(f"crashes {len(self.crashes)}")
        for name, value in (extra or {}).items():
            print(f"{name} {value}")
        print(f"unpickled {len(DETONATED)}")
        print(f"RSS {self.rss:.0f} MB before the flood, {rss:.0f} MB after it ({rss - self.rss:+.0f} MB)")
        print(f"open fds {self.fds} before the flood, {fds} after it")
        assert total >= self.minimum, self.tried
        assert not self.crashes, self.crashes[:10]
        assert not DETONATED
        assert rss - self.rss < 200, (self.rss, rss)
        assert fds <= self.fds + 8, (self.fds, fds)
