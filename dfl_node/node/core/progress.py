"""Where a node stands in its fleet's work: the round it reached, the token epoch it knows, the last round it
played, whether it holds the token, and whether its run is over. One owner: :class:`RoundProgress` changes only
through its methods, each of which keeps one rule (rounds and epochs only advance; a round played is never played
again); schedulers, roles and the checkpoint read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dfl_node.node.core.clock import Clock


class RoundProgress:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._round = 0  # rounds completed (round mode) or group exchanges taken part in (async mode)
        self._epoch = 0  # round mode: the newest token epoch seen (fencing)
        # round mode: the last round this node completed a role in (its fusion, or its transfer confirmed fused),
        # durable, so that a retried or regenerated round never makes it fuse or send for that round again
        self._played = -1
        self._done = False
        self._holding = False  # round mode: this node holds the round token
        self._holding_since: float | None = None  # wall clock: since when it holds it (for /fleet's token age)
        self._token_state: dict[str, str] = {}  # the algorithm state the round token carries

    @property
    def round(self) -> int:
        return self._round

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def played(self) -> int:
        return self._played

    @property
    def done(self) -> bool:
        return self._done

    @property
    def holding(self) -> bool:
        return self._holding

    @property
    def holding_since(self) -> float | None:
        return self._holding_since

    @property
    def token_state(self) -> dict[str, str]:
        """A copy: the state the next token carries changes only through :meth:`advance`."""
        return dict(self._token_state)

    @property
    def stamp(self) -> tuple[object, ...]:
        """Everything a :class:`~dfl_node.peering.messages.Progress` says of it, cheap to compare (its token state
        the object itself: replaced when it changes, never changed in place): a node's Hello, which every membership
        message carries, is built again only when this changed."""
        return self._round, self._epoch, self._holding, self._done, self._token_state

    def enter_epoch(self, epoch: int) -> bool:
        """Fencing: False (and nothing changes) for an epoch older than ours."""
        if epoch < self._epoch:
            return False
        self._epoch = epoch
        return True

    def advance(self, round_: int, token_state: Mapping[str, str]) -> None:
        """Rounds only advance: an announcement can arrive after the next holder's own (announcements to the
        other members go on after the hand-over), and a node that played a round already counts it."""
        if round_ >= self._round:
            self._round, self._token_state = round_, dict(token_state)

    def set_holding(self, holding: bool) -> None:
        if holding and not self._holding:
            self._holding_since = self._clock.wall()
        self._holding = holding

    def played_in(self, round_: int, token_state: Mapping[str, str]) -> None:
        """Round mode: this node completed a role in ``round_`` (checkpointed with the model next): it never plays
        that round again, and rounds up to it are complete (the token for the next round would carry the plan's
        ``token_state``)."""
        self._played = max(self._played, round_)
        if round_ + 1 > self._round:
            self._round, self._token_state = round_ + 1, dict(token_state)

    def exchanged(self) -> None:
        """Async mode: one more group exchange taken part in."""
        self._round += 1

    def finish(self, round_: int) -> None:
        """The fleet is done at ``round_`` (round mode), or this node's time budget is over (async mode: its round
        as it is)."""
        self._round, self._done = round_, True

    def durable(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (holding is about this process only)."""
        return {"round": self._round, "epoch": self._epoch, "played": self._played, "done": self._done,
                "token_state": dict(self._token_state)}

    def restore(self, saved: Mapping[str, Any], done: bool) -> None:
        """A checkpoint's progress; ``done``: whether the run is over under the settings given *now*, not those
        saved (a node restarted with more ``--rounds`` goes on; in async mode a restarted node volunteers again)."""
        self._round, self._epoch = saved.get("round", 0), saved.get("epoch", 0)
        self._played = saved.get("played", -1)
        self._token_state = dict(saved.get("token_state", {}))
        self._done = done
