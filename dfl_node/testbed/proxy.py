"""A weak link in userspace: a TCP proxy that slows, cuts or drops the connections it forwards.

The kernel here has no ``netem`` (``tc qdisc … netem`` is missing), so a slow or breaking link cannot be set on
an interface. Put this proxy in front of a node's port instead and send every connection to that node through
it: each direction of each connection is held to ``rate`` bytes/s (a token bucket with a 1/20 s burst, so the
rate holds over any window of a second or more), each connection is reset ``cut_after`` seconds after it was
accepted, and ``down`` resets them at once. That is what resumable transfers are tested against.

In-process (tests, scripts) :class:`~dfl_node.testbed.threaded_proxy.LinkProxy` runs on a thread of its own;
inside a running event loop, :class:`~dfl_node.testbed.async_proxy.AsyncLinkProxy` (which splices the connections,
held to the bucket by TCP backpressure); their counts are :mod:`dfl_node.testbed.link_counts`. This module is the
command line::

    python -m dfl_node.testbed.proxy --listen 127.0.0.1:6000 --target 127.0.0.1:50051 --rate 100k --cut-after 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from dfl_node.rates import parse_rate
from dfl_node.testbed.addresses import format_address, parse_address
from dfl_node.testbed.async_proxy import AsyncLinkProxy

__all__ = ["main"]

T = TypeVar("T")


def _argument(parse: Callable[[str], T], what: str) -> Callable[[str], T]:
    """``parse`` as an argparse type: its ValueError becomes argparse's one-line error (exit 2), named ``what``."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = what
    return convert


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not seconds: {text!r}") from None
    if not value >= 0:
        raise ValueError(f"seconds must be >= 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block above it): ``prog: error: …``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m dfl_node.testbed.proxy",
        description="Forward TCP connections through an emulated weak link (the kernel here has no netem): "
                    "each direction held to --rate, each connection reset --cut-after seconds after it was "
                    "accepted, or every connection reset at once (--down). Logs one line per connection; on "
                    "SIGINT/SIGTERM prints the counters as JSON and exits 0.",
        epilog="example: --listen 127.0.0.1:6000 --target 127.0.0.1:50051 --rate 100k --cut-after 5, then point "
               "a peer at 127.0.0.1:6000",
    )
    parser.add_argument("--listen", type=_argument(parse_address, "address"), default=("127.0.0.1", 0),
                        metavar="HOST:PORT",
                        help="where to accept connections (default 127.0.0.1:0: a free port, printed as "
                             "'listening on HOST:PORT' on stdout)")
    parser.add_argument("--target", type=_argument(parse_address, "address"), required=True, metavar="HOST:PORT",
                        help="where to forward them (a node's gRPC port, say)")
    parser.add_argument("--rate", type=_argument(parse_rate, "rate"), default=None, metavar="BYTES_PER_S",
                        help="bytes/s each way, per connection: 2000, 100k (1e3), 1.5M (1e6); default unlimited")
    parser.add_argument("--cut-after", type=_argument(_seconds, "seconds"), default=None, metavar="SECONDS",
                        help="reset each connection this long after accepting it; default never")
    parser.add_argument("--down", action="store_true", help="accept connections and reset them at once")
    return parser


async def _serve(proxy: AsyncLinkProxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await proxy.start()
    print(f"listening on {format_address(proxy.address)} -> {format_address(proxy.target)}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.close()


def main(argv: list[str] | None = None) -> int:
    """The command line: run the proxy until SIGINT or SIGTERM, then print its counters as JSON."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    proxy = AsyncLinkProxy(args.target, args.listen, rate=args.rate, cut_after=args.cut_after, down=args.down)
    try:
        asyncio.run(_serve(proxy))
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(proxy.counters.now().as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
