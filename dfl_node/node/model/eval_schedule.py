"""When a node evaluates its model: at the rounds an accuracy curve has points, and at the end.

Evaluating after every change cost more than the round itself where the test set is large (a 10k-image
test set against a round of a small MLP), and nobody reads more than the curve's points. Each change at
a round that is a point (every ``every``-th: the simulator's ``eval_every``) is evaluated at once. A change
at another round leaves its model *owed*: that model stands for every round until the next change, so
before the next role changes it, it is evaluated if a point fell in between — the curve of a fleet of
daemons has the same points, and the same values, as the simulator's. The end of a run always evaluates.
"""

from __future__ import annotations


class EvalSchedule:
    def __init__(self, every: int, enabled: bool) -> None:
        self.every, self.enabled = every, enabled
        self.owed_since: int | None = None  # the round of the standing model, while it was never evaluated

    def at_change(self, round_: int) -> bool:
        """A change made the model of ``round_``: whether to evaluate it now (else it is owed)."""
        if not self.enabled:
            return False
        now = round_ % self.every == 0
        self.owed_since = None if now else round_
        return now

    def owe(self, round_: int) -> None:
        """The standing model, of ``round_``, was never evaluated (a checkpoint's, resumed from)."""
        self.owed_since = round_

    def settled(self) -> None:
        """The standing model was evaluated."""
        self.owed_since = None

    def owed(self, upto: int | None) -> int | None:
        """The round of the standing model if it must be evaluated before a role of round ``upto`` changes it
        (a point lies between its round and ``upto``); ``upto`` None: the run ends, anything owed is due."""
        since = self.owed_since
        if since is None or (upto is not None and upto // self.every * self.every < since):
            return None
        return since
