"""Whose work each task of a simulation is: the node at an address, so that a kill -9 of that node can cancel it.

A simulation runs every node on one event loop. :class:`TaskOwners` (a part of
:class:`~dfl_node.sim.network.MemoryFabric`) marks each task with the address of the node it works for, and
hands that mark on to every task it starts; :func:`current_node` reads it (a device's compute time is charged to
the node whose task runs: :mod:`dfl_node.sim.costs`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import defaultdict
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

# The address of the node whose work the current task is: set for a node's own tasks (:meth:`MemoryFabric.spawn`)
# and for each call it serves, and inherited by every task they start, so that a kill can find them all.
_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("dfl_sim_owner", default=None)


def current_node() -> str | None:
    """The address of the node whose task is running now (see :meth:`MemoryFabric.install`), if any."""
    return _OWNER.get()



class TaskOwners:
    """The fabric's record of every live task of each node, by address (see the module's docstring)."""

    def __init__(self) -> None:
        self.owned: dict[str, set[asyncio.Task[Any]]] = defaultdict(set)  # every live task of a node, by address
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Track on ``loop`` which node each task works for (its task factory): a task started by a node's task,
        or by a call it serves, is that node's, so :meth:`kill` cancels whatever the node was doing — its
        scheduler, its hold of the token, a role it plays, an announcement it sends — as kill -9 would."""
        self._loop = loop
        loop.set_task_factory(self._task_factory)

    def _task_factory(self, loop: asyncio.AbstractEventLoop,
                      coro: Coroutine[Any, Any, T] | Generator[Any, None, T], /, *,
                      context: contextvars.Context | None = None) -> asyncio.Task[T]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = _OWNER.get(None) if context is None else context.get(_OWNER)  # None: the task runs in a copy of ours
        if owner is not None:
            owned = self.owned[owner]
            owned.add(task)
            task.add_done_callback(owned.discard)
        return task

    def _as(self, address: str) -> contextvars.Context:
        context = contextvars.copy_context()
        context.run(_OWNER.set, address)
        return context

    def spawn(self, address: str, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``work`` as a task of the node at ``address`` (one that :meth:`kill` cancels)."""
        if self._loop is None:
            self.install(asyncio.get_running_loop())
        return asyncio.get_running_loop().create_task(work, context=self._as(address))

