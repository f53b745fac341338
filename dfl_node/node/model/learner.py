"""The model and its checkpoints: one part of a node owns them (:class:`Learner`).

It holds the node's model, its algorithm's extra models and its data on the node's device (the algorithm's
:class:`~dfl_node.algorithms.NodeContext`), the model's identity (fingerprint, the layouts of other architectures
it fuses), what the model scores and how its values hash, the history of every change, and the checkpoint
folder. A role changes the model in place, through the algorithm, while it holds the role
(:mod:`.roles`); everything else about the model goes through here: evaluating it on the schedule
(:mod:`.eval_schedule`), recording a change, checkpointing it with the rest of the node's durable state (its
progress and tally, read from their owners), putting it back as the newest checkpoint has it when a role fails,
and the committed copy ``/model`` and ``/predict`` serve (:mod:`.served`).

Evaluation, the sha256 of a possibly large model and the checkpoint writes run in worker threads, off the event
loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dfl_node.algorithms import Algorithm, NodeContext, NodeProfile
from dfl_node.algorithms.base import equip
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.devices import resolve_device, use_backends
from dfl_node.learning.export import TrainedModel
from dfl_node.learning.models import ModelSpec, fingerprint, param_digest
from dfl_node.learning.privacy import PrivateTraining
from dfl_node.learning.tasks import task_of
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.identity import Layout, ModelIdentity
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.model.data_watch import NodeData
from dfl_node.node.model.eval_schedule import EvalSchedule
from dfl_node.node.model.persistence import Checkpoint, load_served
from dfl_node.node.model.served import ServedModel
from dfl_node.records.history import HistoryEntry, SeriesAccuracy
from dfl_node.settings.node import StorageSettings

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits
MAX_LAYOUTS = 64  # other architectures' layouts kept at most: peers cannot grow the table without limit


class Learner:
    """``progress`` and ``tally`` are read, for what a checkpoint keeps besides the model; ``role`` says the role
    a history entry is made in."""

    def __init__(self, node_id: str, algorithm: Algorithm, learning: SharedSettings, data: NodeData,
                 storage: StorageSettings, state_path: Any, schedule: EvalSchedule, clock: Clock, *,
                 progress: RoundProgress, tally: Tally, role: Callable[[], str]) -> None:
        self.node_id, self.algorithm = node_id, algorithm
        self._clock, self._progress, self._tally, self._role = clock, progress, tally, role
        self.device = resolve_device(learning.device)  # the shard, the test set and the model move there once
        use_backends(learning.precision, learning.cudnn_benchmark)
        self.test = data.test.to(self.device) if data.test is not None else None
        spec = ModelSpec(learning.model, tuple(learning.hidden) if learning.hidden else None)
        outputs = task_of(learning).outputs(data.train)  # classes, targets, or an autoencoder's sample
        model = spec.build(data.train.input_shape, outputs, seed=learning.seed).to(self.device)
        # every step on its data DP-SGD, the account checkpointed (dfl_node.learning.privacy)
        privacy = PrivateTraining(learning, node_id, len(data.train)) if learning.private else None
        self.ctx = NodeContext(node_id, model, spec, data.train.to(self.device), data.val.to(self.device), learning,
                               privacy=privacy)
        equip(algorithm, self.ctx, learning.seed)  # its extra models (DFML's peak, FML's meme), w0 as the sim's
        if privacy is not None:
            for name, each in {str(spec): model, **self.ctx.auxiliary}.items():
                PrivateTraining.check_model(each, name)
        self.fingerprint = fingerprint(learning.model, model.state_dict())
        self._layouts: dict[str, tuple[str, Layout]] = {}
        self.checkpoint = Checkpoint(state_path, fsync=storage.fsync)
        self._schedule = schedule
        self._history: deque[HistoryEntry] = deque(maxlen=storage.history_limit)  # the newest only
        self._accuracy: tuple[float | None, float | None] = (None, None)  # (local, global) of the current model
        self._digest = ""  # sha256 of the current parameters
        self._eval_speed: float | None = None  # seconds per sample of the newest evaluation
        self._saving = asyncio.Lock()
        self._saved: dict[str, Any] | None = None  # the durable state this process last checkpointed (:meth:`save`)
        self.served = ServedModel(algorithm, self.ctx)  # what /model, /predict and exports hold

    # ----- what others read ----------------------------------------------------------------
    @property
    def accuracy(self) -> tuple[float | None, float | None]:
        return self._accuracy

    @property
    def digest(self) -> str:
        return self._digest

    def history(self) -> list[HistoryEntry]:
        return list(self._history)

    def profile(self) -> NodeProfile:
        """This node as round plans see it: its architecture and sample count."""
        return self.ctx.profile()

    def identity(self, swarm: str, wire_dtype: str) -> ModelIdentity:
        """Our model as the network checks peers' models against it (:mod:`.identity`)."""
        resolve = self._layout_of if self.algorithm.architectures == "any" else None
        layout = {name: tensor.to("meta") for name, tensor in self.ctx.model.state_dict().items()}
        return ModelIdentity(swarm, str(self.ctx.spec), self.fingerprint, layout, wire_dtype, resolve)

    def _layout_of(self, model: str) -> tuple[str, Layout]:
        """Another architecture's fingerprint and layout, built from our registry for our data (shapes only, on
        the meta device: a hostile spec of huge widths allocates nothing, and fails the size check)."""
        if model not in self._layouts:
            if not self.algorithm.fuses(str(self.ctx.spec), model):
                raise ValueError(f"{self.algorithm.name} does not fuse {model} with {self.ctx.spec}")
            spec = ModelSpec.parse(model)
            layout = spec.build(self.ctx.train.input_shape, self.ctx.train.num_classes, device="meta").state_dict()
            if len(self._layouts) >= MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[model] = fingerprint(spec.name, layout), layout
        return self._layouts[model]

    # ----- the data ------------------------------------------------------------------------
    def use_data(self, train: ArrayDataset, val: ArrayDataset) -> None:
        """New training and validation sets, from the next role on (the caller made sure no role holds them)."""
        self.ctx.use_data(train.to(self.device), val.to(self.device))

    # ----- checkpoints ---------------------------------------------------------------------
    def load(self) -> Mapping[str, Any] | None:
        """Resume from the newest checkpoint that verifies, if any: the models and the history; returns what the
        checkpoint says of the node's other parts (None: there is none), which their owners restore."""
        saved = self.checkpoint.load(self.fingerprint)
        if saved is not None:
            model_state, durable = saved
            self.ctx.restore_checkpoint(model_state)  # the model, and the algorithm's extra models and scalars
            if self.ctx.privacy is not None and "privacy" in durable:
                self.ctx.privacy.restore(durable["privacy"])  # the ε spent before the restart stays spent
            self._history = deque((HistoryEntry.model_validate(h) for h in durable.get("history", [])),
                                  maxlen=self._history.maxlen)
            evaluated = [h for h in self._history if (h.local_accuracy, h.global_accuracy) != (None, None)]
            if evaluated:  # the newest accuracy known (a change off the evaluation schedule has none)
                self._accuracy = (evaluated[-1].local_accuracy, evaluated[-1].global_accuracy)
            newest = self._history[-1] if self._history else None
            if self._schedule.enabled and newest is not None and (newest.local_accuracy, newest.global_accuracy) \
                    == (None, None):
                self._schedule.owe(newest.round)  # the model it resumes with was never evaluated
        self._digest = param_digest(self.ctx.model.state_dict())
        return saved[1] if saved is not None else None

    async def save(self, *, copy: bool = False) -> None:
        """Checkpoint the model and the node's durable state, one write at a time (two would race on the same
        temporary files). A role saves the live model without copying it (on a CPU; from another device, a CPU
        copy): it holds the role, so nothing changes the model meanwhile. ``copy`` is for callers that hold no
        role and waited until none runs (the end of a run, shutdown: :meth:`~.daemon.Node.save`): the model is
        copied right then, so a role taken during the write cannot tear the checkpoint. A save that would write
        what the newest checkpoint of this process holds writes nothing: the model changes only in a role, and a
        role that changes it records that in the history (:meth:`changed`), which is saved too; so a node stopped
        after its run's end was checkpointed (a simulated fleet's thousand nodes, a daemon told to stop) does not
        write it again."""
        durable = {**self._progress.durable(), **self._tally.durable(),
                   "history": [h.model_dump(mode="json") for h in self._history]}
        if self.ctx.privacy is not None:
            durable["privacy"] = self.ctx.privacy.state()
        if self.checkpoint.generation is not None and durable == self._saved:
            return
        snapshot = self.ctx.snapshot() if copy else None
        async with self._saving:
            await asyncio.to_thread(self._save, durable, snapshot)
            self._saved = durable

    def _save(self, durable: dict[str, Any], snapshot: dict[str, torch.Tensor] | None) -> None:
        state = self.ctx.checkpoint_state() if snapshot is None else snapshot
        model = {name: tensor.detach().cpu() for name, tensor in state.items()}
        self.checkpoint.save(model, self.fingerprint, durable, self.served.metadata())
        # the live model's tensors (no snapshot, on the CPU) are copied: the next role changes them in place
        self.served.commit(model, durable["round"], shared=snapshot is None and self.device.type == "cpu")

    async def checkpointed(self) -> None:
        """Until a checkpoint exists: what a role that fails goes back to (:meth:`restore_durable`). A new node's
        first is its ``w0``, written once it serves (a start-up that fails writes nothing), or by the first role
        that comes sooner."""
        if self.checkpoint.generation is None:
            await self.save()

    async def restore_durable(self) -> None:
        """Put the models back as the newest checkpoint has them: a role that did not complete leaves nothing
        that lasts. Every change is checkpointed before the next role starts, and a role starts from a checkpoint
        (:meth:`checkpointed`), so that is the model the role found — read back from disk rather than copied before
        every role, which held one more model in memory for the whole role."""
        saved = await asyncio.to_thread(self.checkpoint.load, self.fingerprint)
        if saved is None:  # the role waited for one: the folder was emptied under the running node
            raise RuntimeError(f"{self.node_id}: no checkpoint to restore the model from")
        self.ctx.restore_checkpoint({name: tensor.to(self.device) for name, tensor in saved[0].items()}, exact=True)

    async def committed_model(self) -> TrainedModel | None:
        """The committed model, for ``/model`` and ``/predict`` (:mod:`.served`); None before the first checkpoint.
        The first call reads it from the checkpoint while no save runs (the files are then one whole checkpoint);
        every later save replaces the copy kept since."""
        if self.served.committed is None:
            async with self._saving:
                if self.served.committed is None and self.checkpoint.generation is not None:
                    self.served.keep(await asyncio.to_thread(load_served, self.checkpoint.directory,
                                                             self.served.served, self.fingerprint))
        return self.served.committed

    # ----- evaluation and the history ------------------------------------------------------
    async def evaluate_start(self) -> None:
        """The w0 point of the accuracy curve, once per state dir (a restarted node has its history); then the
        first checkpoint."""
        if self._schedule.enabled and not self._history:
            await self.changed("eval", self._progress.round, None)
        await self.checkpointed()

    async def changed(self, event: str, round_: int, peer: str | None,
                      detail: Callable[[], dict[str, float | int | str]] | None = None) -> bool:
        """After every change of the model: evaluate (on the schedule), fingerprint the values, record, checkpoint;
        returns whether the model was evaluated. ``detail``, called once the model is measured, is what the
        history entry says of the exchange that changed it."""
        evaluated = self._schedule.at_change(round_)
        started = self._clock.monotonic()
        accuracies, self._digest = await asyncio.to_thread(self._measure, evaluated)
        if evaluated:
            self._timed_evaluation(self._clock.monotonic() - started)
        self._record(round_, event, accuracies, peer=peer, detail=detail() if detail is not None else None)
        await self.save()
        return evaluated

    async def settle_evaluation(self, upto: int | None) -> None:
        """Evaluate the standing model if it is owed (:meth:`EvalSchedule.owed`): before a role of round ``upto``
        changes it, or at the end (None; also when there is no accuracy at all yet). Recorded as an ``eval``
        entry at the round of the model, which it stood for."""
        since = self._schedule.owed(upto)
        if since is None and not (upto is None and self._schedule.enabled and self._accuracy == (None, None)):
            return
        accuracies = await asyncio.to_thread(self.evaluate)
        self._schedule.settled()
        self._record(self._progress.round if since is None else since, "eval", accuracies)

    def _record(self, round_: int, event: str, accuracies: dict[str, SeriesAccuracy] | None, *,
                peer: str | None = None, detail: dict[str, float | int | str] | None = None) -> None:
        """A history entry for ``event``; ``accuracies`` (from :meth:`evaluate`, None where the model was not
        evaluated) become the node's accuracy and the entry's, the first model's as the node's own."""
        local, global_, others = None, None, {}
        if accuracies is not None:
            own, *_ = accuracies
            local, global_ = self._accuracy = (accuracies[own].local_accuracy, accuracies[own].global_accuracy)
            others = {name: accuracy for name, accuracy in accuracies.items() if name != own}
        self._history.append(HistoryEntry(round=round_, time=self._clock.wall(), event=event, role=self._role(),
                                          peer=peer, local_accuracy=local, global_accuracy=global_, series=others,
                                          bytes_received=self._tally.counters["bytes_received"],
                                          detail=detail or {}))

    def _timed_evaluation(self, seconds: float) -> None:
        samples = (len(self.ctx.val) + (len(self.test) if self.test is not None else 0)) * len(
            self.algorithm.reported_models(self.ctx))
        if samples:
            self._eval_speed = seconds / samples

    def work_estimate(self) -> float:
        """Seconds a role's computation may take here before any role measured it (0: unknown): from the speed of
        the newest evaluation, a training sample costing about three forward passes, and a fusion (mutual
        learning) training two models, for the node's epochs over its training samples. Deadlines follow it."""
        if self._eval_speed is None:
            return 0.0
        c = self.ctx.config
        return 6 * self._eval_speed * self.ctx.num_samples * max(c.local_epochs, c.mkt_epochs)

    def _measure(self, evaluated: bool) -> tuple[dict[str, SeriesAccuracy] | None, str]:
        return self.evaluate() if evaluated else None, param_digest(self.ctx.model.state_dict())

    def evaluate(self) -> dict[str, SeriesAccuracy]:
        """The accuracies of every model the algorithm reports, by name, the node's own first (DFML: its peak
        model; then DFML's regular model, FML's meme model): on its validation split and the global test set."""
        val, test = self.ctx.val, self.test
        task = self.ctx.task
        return {name: SeriesAccuracy(local_accuracy=task.evaluate(model, val).score if len(val) else None,
                                     global_accuracy=task.evaluate(model, test).score if test is not None else None)
                for name, model in self.algorithm.reported_models(self.ctx).items()}
