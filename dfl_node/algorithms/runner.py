"""The round sequence, written once: local steps → transmissions → aggregate → replies.

A node plays its roles in a group with these coroutines, over a :class:`Transport` — the node's
(:class:`~dfl_node.node.exchange.transport.PeerTransport`), whose messages cross its peer network: gRPC streams in a
daemon, memory in the simulator, which runs the same nodes. What a transport must guarantee is small:
``push`` delivers a sender's message to its group's aggregator and returns the reply addressed to
that sender (None if the algorithm sends none); ``gather`` returns the messages that reached the
aggregator (pushed to it, or pulled by it from the group's sources); ``reply`` hands each sender
its answer. ``compute`` runs the CPU-heavy algorithm calls (inline, or in a worker thread).
Messages are sorted by sender before ``aggregate``, so arrival order never changes a model.

Where a defence is on (:mod:`dfl_node.algorithms.defences`), the aggregator screens the messages it
gathered — after its own local step, so it compares them with the model it fuses them into — and a
sender the reply it gets; ``refuse`` counts each refusal, and tells a refused sender so. A group whose
every message was refused still completes (the aggregator fused none): it is not played again.

Every step that changes the node's own models runs :func:`~dfl_node.algorithms.step_guard.guarded`: one that leaves a
NaN or ±Inf is undone (:func:`_undo`: the transport puts back the state the role began from, its durable checkpoint,
and the role's earlier steps are played again). A fusion undone refuses the messages it fused
(``non_finite_result``: finite values that poison a fusion, a model scaled a millionfold, are no better than NaN)
and answers nobody; a reply whose use went non-finite is refused as such; a node's own training that diverged is
undone and said (``diverged``) — a sender then sends nothing (:class:`NonFinite` ends its role), an aggregator fuses
into its model as it was.

An **open** group (001's client selection) has no aggregator yet: its sender trains, then chooses
one (:func:`choose_receiver`) — ``probe`` asks each candidate for its answer to the sender's probe
(those that do not answer in time are left out), the algorithm ranks the answers, and ``bind`` makes
the best candidate that takes the role the group's aggregator (the sender gives it the role, as a token
holder would). Only then does the transfer start. The choice reads nothing but the sender's trained model
and the candidates' current models, which are the same on either network (a candidate settles its last role
before it answers), so a fleet of daemons and the simulator choose the same receivers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext
from dfl_node.algorithms.defences import Refusal, screen
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step
from dfl_node.algorithms.selection import Probe, ProbeAnswer, SelectsReceiver
from dfl_node.algorithms.step_guard import NON_FINITE_RESULT, NonFinite, guarded
from dfl_node.learning.algorithm_settings import DefenceSettings

T = TypeVar("T")


class Transport(Protocol):
    async def compute(self, fn: Callable[..., T], *args: object) -> T: ...
    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None: ...
    async def gather(self, step: Step) -> list[ModelMessage]: ...
    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None: ...
    def refuse(self, refusal: Refusal) -> None: ...  # a defence refused (or bounded) a message of this role
    def diverged(self, detail: str) -> None: ...  # the node's own training went non-finite and was undone
    async def restore(self) -> None: ...  # the node's models back as its role began (its durable checkpoint)
    # open groups only: each candidate's answer (the silent left out), and whether a candidate took the role
    async def probe(self, step: Step, probe: Probe) -> dict[str, ProbeAnswer]: ...
    async def bind(self, step: Step) -> bool: ...


class SelectionFailed(Exception):
    """No candidate of an open group took the aggregator role: the sender's round ends without a transfer."""


NO_DEFENCES = DefenceSettings()


async def play_sender(algorithm: Algorithm, ctx: NodeContext, step: Step, transport: Transport,
                      defences: DefenceSettings = NO_DEFENCES) -> None:
    """Train, choose the aggregator if the group is open, transmit to it, then use its reply (if it passes
    ``defences``)."""
    try:
        message = await transport.compute(guarded(ctx, algorithm.transmit), ctx, step)
    except NonFinite as exc:
        await _undo(transport, ctx, step)
        transport.diverged(f"round {step.round + 1}: training to send left {exc}; undone, nothing sent")
        raise
    if step.group.open:
        step = await choose_receiver(algorithm, ctx, step, message, transport)
    reply = await transport.push(step, message)
    if reply is not None and defences.on:
        kept = await _screened(ctx, [reply], defences, transport)
        if not kept:
            return  # the aggregator's reply refused: this node's own model stands
        reply = kept[0]
    if reply is None:
        await transport.compute(algorithm.finish, ctx, step, reply)
        return
    try:
        await transport.compute(guarded(ctx, algorithm.finish), ctx, step, reply)
    except NonFinite as exc:  # this node's own model stands, as for a reply a defence refused
        await _undo(transport, ctx, step, algorithm.transmit)
        transport.refuse(Refusal(reply.sender, NON_FINITE_RESULT, f"round {step.round + 1}: using {reply.purpose} "
                                 f"left {exc}; undone"))


async def _undo(transport: Transport, ctx: NodeContext, step: Step,
                earlier: Callable[[NodeContext, Step], object] | None = None) -> None:
    """Put the node's models back as they were before a step of ``step`` that went non-finite: as its role began
    (the transport's :meth:`~Transport.restore`), then the role's ``earlier`` step played again. That step is
    deterministic (its randomness comes from the seed, the round and the node), so this is the state the failed
    step found, bit for bit, without a copy of the model kept through every step."""
    await transport.restore()
    if earlier is not None:
        try:
            await transport.compute(guarded(ctx, earlier), ctx, step)
        except NonFinite:  # it diverged the first time too, and was undone then: undone again
            await transport.restore()


async def choose_receiver(algorithm: Algorithm, ctx: NodeContext, step: Step, message: ModelMessage,
                          transport: Transport) -> Step:
    """The selection step of an open group; returns the step bound to the chosen aggregator.

    Candidates are tried best first; those that did not answer the probe come last, in id order,
    as a last resort (a probe lost is not a node lost).
    """
    if not isinstance(algorithm, SelectsReceiver):
        raise AlgorithmError(f"{algorithm.name} plans open groups but does not select receivers")
    probe = await transport.compute(algorithm.probe, ctx, step, message)
    answers = await transport.probe(step, probe)
    ranking = await transport.compute(algorithm.rank, ctx, step, probe, answers) if answers else []
    silent = [c for c in step.group.candidates if c not in answers]
    for candidate in [*ranking, *silent]:
        bound = Step(step.round, step.group.bound(candidate), step.state)
        if await transport.bind(bound):
            return bound
    raise SelectionFailed(f"round {step.round}: none of {', '.join(step.group.candidates)} took {ctx.node_id}'s model")


async def play_aggregator(algorithm: Algorithm, ctx: NodeContext, step: Step, transport: Transport,
                          defences: DefenceSettings = NO_DEFENCES) -> int:
    """Own local step, then fuse every message that arrived (and passed ``defences``) and answer their senders;
    returns how many arrived."""
    try:
        await transport.compute(guarded(ctx, algorithm.local_step), ctx, step)
    except NonFinite as exc:
        await _undo(transport, ctx, step)
        transport.diverged(f"round {step.round + 1}: the local step left {exc}; undone")
    arrived = messages = sorted(await transport.gather(step), key=lambda m: m.sender)
    if messages and defences.on:
        messages = await _screened(ctx, messages, defences, transport)
    replies: Mapping[str, ModelMessage] = {}
    if messages:
        try:
            replies = await transport.compute(guarded(ctx, algorithm.aggregate), ctx, step, messages)
        except NonFinite as exc:  # the group completes with nothing fused, as when a defence refused all
            await _undo(transport, ctx, step, algorithm.local_step)
            detail = f"round {step.round + 1}: fusing {', '.join(m.sender for m in messages)} left {exc}; undone"
            for message in messages:
                transport.refuse(Refusal(message.sender, NON_FINITE_RESULT, detail))
    await transport.reply(step, replies)
    return len(arrived)


async def _screened(ctx: NodeContext, messages: list[ModelMessage], defences: DefenceSettings,
                    transport: Transport) -> list[ModelMessage]:
    """The messages that pass ``defences`` (a capped count replaced); each refusal told to the transport."""
    kept, refused = await transport.compute(screen, ctx, messages, defences)
    for refusal in refused:
        transport.refuse(refusal)
    return kept
