"""The weak-link proxy for code that has no event loop (tests, scripts, benchmarks): :class:`LinkProxy` runs an
:class:`~dfl_node.testbed.async_proxy.AsyncLinkProxy` on a loop of its own, in a daemon thread, and lets its
settings be changed and its counts read from the caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from contextlib import suppress
from types import TracebackType
from typing import Self

from dfl_node.testbed.addresses import Address, format_address
from dfl_node.testbed.async_proxy import AsyncLinkProxy
from dfl_node.testbed.link_counts import LinkCounts

log = logging.getLogger("dfl_node.testbed.proxy")  # the proxy's one logger, under the name it has run with -m

START_TIMEOUT_S = 10.0


class LinkProxy:
    """The proxy on its own event loop in a daemon thread, for code that has no loop (tests, scripts)::

        with LinkProxy(target=("127.0.0.1", port), rate=100_000, cut_after=5.0) as proxy:
            connect_to(proxy.port)
            ...
            proxy.cut_after = None  # connections accepted from now on are not cut

    Leaving the ``with`` block (or :meth:`stop`) closes the listener and every open connection and joins the
    thread; :attr:`counters` stay readable."""

    def __init__(self, target: Address, listen: Address = ("127.0.0.1", 0), *, rate: float | None = None,
                 cut_after: float | None = None, down: bool = False) -> None:
        self._proxy = AsyncLinkProxy(target, listen, rate=rate, cut_after=cut_after, down=down)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()

    # settings, shared with the loop's thread: each is one attribute, read when a connection is accepted
    @property
    def rate(self) -> float | None:
        """Bytes/s allowed each way on each new connection; None: unlimited."""
        return self._proxy.rate

    @rate.setter
    def rate(self, rate: float | None) -> None:
        self._proxy.rate = rate

    @property
    def cut_after(self) -> float | None:
        """Seconds after which each new connection is reset; None: never."""
        return self._proxy.cut_after

    @cut_after.setter
    def cut_after(self, cut_after: float | None) -> None:
        self._proxy.cut_after = cut_after

    @property
    def down(self) -> bool:
        """Whether new connections are reset as soon as they are accepted."""
        return self._proxy.down

    @down.setter
    def down(self, down: bool) -> None:
        self._proxy.down = down

    @property
    def target(self) -> Address:
        """Where connections are forwarded."""
        return self._proxy.target

    @property
    def counters(self) -> LinkCounts:
        """Connections accepted and cut, bytes forwarded each way, now: readable while it runs and after."""
        return self._proxy.counters.now()

    @property
    def address(self) -> Address:
        """Where it listens (the port the kernel chose, for port 0)."""
        return self._proxy.address

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._proxy.port

    def start(self) -> Self:
        """Start the thread and listen; raises what binding raised (the port is taken, …)."""
        if self._thread is not None:
            raise RuntimeError("the proxy was started already")
        self._thread = threading.Thread(target=self._run, name=f"link-proxy-{format_address(self.target)}",
                                        daemon=True)
        self._thread.start()
        try:
            self._started.result(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every open connection, and join the thread. Idempotent."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            with suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the proxy's thread did not stop within {timeout:g} s")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # handed to start(), which raises it
            if not self._started.done():
                self._started.set_exception(error)
            else:
                log.exception("the link proxy's loop failed")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self._proxy.start()
        self._started.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await self._proxy.close()
