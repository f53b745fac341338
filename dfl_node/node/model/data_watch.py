"""A node's own data: read at start (a bad file stops it with one line, exit 2), looked at again every
``--data-poll`` seconds, and swapped in between roles when files were added or grew.

A look is a directory listing and a stat per file (:meth:`~dfl_node.learning.local_data.LocalData.scan`): cheap
when nothing changed. A file is read once it has stayed the same for one look (a writer may be half-way through
it), in a worker thread; the node's training and validation sets are then replaced where no role holds them
(:meth:`~dfl_node.node.exchange.roles.Roles.quiesce`): never in the middle of a training or a fusion, and handed to the
model's owner (:meth:`~dfl_node.node.model.learner.Learner.use_data`). Its profile (sample count), which plans and
averaging weights read, follows, since it is read from the data. A file version that
cannot be read is skipped with one WARNING and counted in ``/status``; the node keeps the data it had.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dfl_node.learning.algorithm_settings import SharedSettings, sized_defaults
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.local_data import DataView, LocalData, read_test_set
from dfl_node.learning.tasks import task_of
from dfl_node.node.core.clock import Clock
from dfl_node.records.status import DataStatus
from dfl_node.settings.node import DataSettings

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits
MAX_SHOWN = 20  # skipped files named in /status, at most (all are counted)


class NodeData:
    """The data of node ``node_id``, as ``settings`` describe it: its training and validation sets, its global
    test set, and what ``/status`` shows of them. Data that carries no learning defaults has them sized to it
    here, in ``learning`` (:func:`~dfl_node.learning.algorithm_settings.sized_defaults`), before anything reads them."""

    def __init__(self, node_id: str, settings: DataSettings, learning: SharedSettings, clock: Clock) -> None:
        self.node_id, self.settings, self._clock = node_id, settings, clock
        reads = task_of(learning).reads
        self.local = LocalData(settings.data, settings, val_fraction=settings.val_fraction,
                               max_samples=settings.max_samples, seed=learning.seed, reads=reads)
        view = self.local.load()
        self.train, self.val = view.train, view.val
        assert self.local.num_classes is not None
        self.test: ArrayDataset | None = None
        if settings.test_data is not None:
            self.test = read_test_set(settings.test_data, settings, self.local.num_classes, self.local.sample_shape,
                                      targets=self.local.targets)
        self.files, self.updated, self.updates, self.skipped_versions = view.files, clock.wall(), 0, 0
        self.skipped: dict[str, str] = {}
        self._announce(view, learning)

    def _announce(self, view: DataView, learning: SharedSettings) -> None:
        """What the node learns from, and with which settings, in one line (and the classes, where inferred)."""
        local, data = self.local, self.settings.data
        sized = learning.use_defaults(sized_defaults(len(view.train)))
        how = f" (sized to its {len(view.train)} training samples)" if sized else ""
        log.info("%s: data %s: %d training + %d validation samples of shape %s, %d %s, in %d file%s; batch size "
                 "%d, MKT batch size %d, lr %g%s", self.node_id, data, len(view.train), len(view.val),
                 local.sample_shape, local.num_classes, "targets" if local.targets else "classes", view.files,
                 "" if view.files == 1 else "s",
                 learning.batch_size, learning.mkt_batch_size, learning.lr, how)
        if local.classes_inferred:
            log.warning("%s: %d classes, inferred from the largest label in %s: every node of a fleet must have the "
                        "same (a device that never saw the last class infers fewer, and its model fits no peer's); "
                        "give --num-classes %d to fix it", self.node_id, local.num_classes, data, local.num_classes)

    def status(self) -> DataStatus:
        return DataStatus(source=str(self.settings.data), train_samples=len(self.train), val_samples=len(self.val),
                          files=self.files, classes=self.local.num_classes or 0,
                          sample_shape=list(self.local.sample_shape), updated=self.updated, updates=self.updates,
                          bad_files=len(self.skipped), skipped_versions=self.skipped_versions,
                          skipped=dict(list(self.skipped.items())[:MAX_SHOWN]))

    async def watch(self, quiesce: Callable[[], Awaitable[None]], take: Callable[[DataView], None]) -> None:
        """Look at the data every ``data_poll`` seconds, until cancelled; what changed is handed to ``take`` once
        ``quiesce`` says no role runs, with no await in between (so none can start meanwhile)."""
        interval = self.settings.data_poll
        if not interval:
            return
        before = self.local.seen
        while True:
            await asyncio.sleep(interval)
            now = await asyncio.to_thread(self.local.scan)
            if now != before or now == self.local.seen:  # still being written (look again), or nothing new
                before = now
                continue
            try:
                view, problems = await asyncio.to_thread(self.local.refresh, now)
            except Exception:  # a bug of ours: said once, and the node keeps learning on the data it has
                log.exception("%s: reading the changed data failed; keeping the data it had", self.node_id)
                continue
            for problem in problems:
                log.warning("%s: data file skipped, the node keeps the data it had: %s", self.node_id, problem)
            self.skipped_versions += len(problems)
            self.skipped = {name: problem[:300] for name, problem in self.local.skipped.items()}
            if view is not None:
                await quiesce()  # no role holds the data from here to the swap: no await in between
                self._take(view)
                take(view)

    def _take(self, view: DataView) -> None:
        old = len(self.train)
        self.train, self.val, self.files = view.train, view.val, view.files
        self.updated, self.updates = self._clock.wall(), self.updates + 1
        log.info("%s: data changed: %d → %d training samples, %d validation, in %d file%s; used from the next "
                 "round on", self.node_id, old, len(view.train), len(view.val), view.files,
                 "" if view.files == 1 else "s")
