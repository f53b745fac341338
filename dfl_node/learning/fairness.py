"""002's fairness-aware adaptive aggregation (eqs. 4–5), as plain functions.

A node i that pulled the model w_j of its learning pair j evaluates both on its own data and weights
them by their performance there:

    P_i = (pef_i − pef_j) / (2·pef_max) + C        (eq. 4)        P_j = 1 − P_i        (eq. 5)

Where 002 leaves a detail open, it is decided here:

* ``pef`` is accuracy (002: "we adopt local accuracy as pef"), so pef ∈ [0, 1].
* ``pef_max`` is the better of the two performances, ``max(pef_i, pef_j)``: then
  (pef_i − pef_j)/(2·pef_max) ∈ [−½, ½], and with 002's C = ½ the weight P_i spans exactly [0, 1] — a model
  that gets nothing right on i's data gets weight 0, two equal models get ½ each. When both score 0
  there is nothing to tell them apart: the difference term is 0 and P_i = C.
* For any other C, P_i is **clipped** to ``[low, high]`` (default [0, 1], both settings:
  ``fair_weight_min``/``fair_weight_max``), so P_i and P_j = 1 − P_i stay convex weights; a narrower
  interval keeps some of both models whatever the scores say.
"""

from __future__ import annotations

import math


def fairness_weight(pef_own: float, pef_other: float, c: float = 0.5, low: float = 0.0, high: float = 1.0) -> float:
    """P_i of eq. 4: the weight of the node's own model; the pulled model gets ``1 − P_i`` (eq. 5)."""
    if not (0.0 <= low <= high <= 1.0):
        raise ValueError(f"the clip interval must lie in [0, 1], got [{low}, {high}]")
    for name, pef in (("pef_own", pef_own), ("pef_other", pef_other)):
        if not (math.isfinite(pef) and 0.0 <= pef <= 1.0):
            raise ValueError(f"{name} must be an accuracy in [0, 1], got {pef}")
    best = max(pef_own, pef_other)
    p = (pef_own - pef_other) / (2.0 * best) + c if best > 0 else c
    return min(high, max(low, p))
