"""Bit allocation across the units of a cache: the exact solution of a multiple-choice knapsack.

The problem
    A cache is split into units ``u = 1..U`` (a layer, a layer's K or V side, or one KV head's
    side), unit ``u`` holding ``w_u`` values. Each unit picks one option ``c`` from its menu
    (a bit width, or float16) at a measured cost of ``r_uc`` bits per value and a measured
    distortion ``D_uc`` (here: the model's mean next-token KL with that unit alone quantized
    with option ``c``). Under the additive model ``D(c_1..c_U) = sum_u D_{u c_u}`` the best
    allocation at an average of at most ``R`` bits per value solves

    .. math::  \\min_{c} \\sum_u D_{u c_u} \\quad \\text{s.t.} \\quad
               \\frac{\\sum_u w_u r_{u c_u}}{\\sum_u w_u} \\le R,

    a multiple-choice knapsack problem [1]_.

Why exact dynamic programming rather than greedy marginal analysis or a Lagrangian
    Greedy marginal analysis (Fox 1966 [2]_; raise the unit with the largest distortion drop per
    added bit) is optimal only when every unit's distortion is a convex function of its cost;
    the Lagrangian relaxation (Everett 1963 [3]_; Shoham and Gersho 1988 [4]_ for bit allocation)
    reaches only the points on the lower convex hull of the achievable (cost, distortion) pairs,
    so at a budget between two hull points it leaves bits unspent. Measured sensitivity curves
    need not be convex (a 1-bit cliff, estimation noise at high widths), and the budgets we
    compare at (a uniform scheme's rate) need not be hull points. The number of distinct total
    costs is small (the options' costs differ by whole bits: at most ``U x (max - min width)``
    sums), so the Pareto frontier of (total cost, total distortion) over all allocations is
    built exactly, unit by unit, by merging each unit's options into the frontier of the units
    before it and discarding dominated points (the classic dynamic programme for the
    multiple-choice knapsack [1]_, exact with no convexity assumption): ``O(U x P x C)`` work
    for ``P`` frontier points and ``C`` options. :func:`allocation_frontier` returns every
    Pareto-optimal allocation; :func:`solve_allocation` the one at a budget.

References
----------
.. [1] Kellerer, H., Pferschy, U., Pisinger, D. (2004) "Knapsack Problems", Springer,
   ch. 11 "The Multiple-Choice Knapsack Problem".
.. [2] Fox, B. (1966) "Discrete optimization via marginal analysis", Management Science
   13(3):210-216.
.. [3] Everett, H. (1963) "Generalized Lagrange multiplier method for solving problems of
   optimum allocation of resources", Operations Research 11(3):399-417.
.. [4] Shoham, Y., Gersho, A. (1988) "Efficient bit allocation for an arbitrary set of
   quantizers", IEEE Trans. Acoustics, Speech and Signal Processing 36(9):1445-1453.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import KvasymError

__all__ = ["AllocationFrontier", "allocation_frontier", "solve_allocation"]

#: Relative tolerance under which two total costs are the same cost (sums of measured rates).
COST_TOLERANCE = 1e-9


@dataclass(frozen=True)
class AllocationFrontier:
    """The Pareto-optimal allocations, by increasing mean cost and decreasing distortion.

    Attributes
    ----------
    mean_cost : ndarray, (P,)
        Each allocation's weighted mean cost (bits per value), increasing.
    distortion : ndarray, (P,)
        Each allocation's total predicted distortion ``sum_u D_{u c_u}``, strictly decreasing.
    choices : ndarray, (P, U) int
        Each allocation's option index per unit.
    """

    mean_cost: np.ndarray
    distortion: np.ndarray
    choices: np.ndarray


def _check(cost: np.ndarray, distortion: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, ...]:
    cost = np.asarray(cost, dtype=np.float64)
    distortion = np.asarray(distortion, dtype=np.float64)
    if cost.ndim != 2 or cost.shape != distortion.shape or 0 in cost.shape:
        raise KvasymError(f"cost and distortion must be equal non-empty (units, options) arrays, got "
                          f"{cost.shape} and {distortion.shape}")
    if not (np.all(np.isfinite(cost)) and np.all(np.isfinite(distortion))):
        raise KvasymError("cost and distortion must be finite (a missing measurement is not an option)")
    weights = np.ones(cost.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    if weights.shape != (cost.shape[0],) or np.any(weights <= 0):
        raise KvasymError(f"weights must be {cost.shape[0]} positive numbers (values per unit)")
    return cost, distortion, weights


def allocation_frontier(cost: np.ndarray, distortion: np.ndarray,
                        weights: np.ndarray | None = None) -> AllocationFrontier:
    """Every Pareto-optimal allocation of the multiple-choice knapsack (module docstring).

    Parameters
    ----------
    cost : array_like, (U, C)
        Bits per value of option ``c`` at unit ``u``.
    distortion : array_like, (U, C)
        Distortion of option ``c`` at unit ``u`` (additive over units).
    weights : array_like, (U,), optional
        Values per unit (default: equal units).

    Returns
    -------
    AllocationFrontier
        Allocations such that no other allocation has both a lower or equal total cost and a
        lower distortion; at equal cost the lower distortion is kept (ties: the lower option
        indices, in unit order).

    Notes
    -----
    Frontier points after ``u`` units are ``(S, D, parent, option)``; the candidates of unit
    ``u + 1`` are every point plus every option, sorted by cost then distortion; a candidate
    survives when its distortion is below every cheaper survivor's. Costs within
    :data:`COST_TOLERANCE` (relative) of each other are one cost.
    """
    cost, distortion, weights = _check(cost, distortion, weights)
    n_units, n_options = cost.shape
    total_cost = np.zeros(1)
    total_dist = np.zeros(1)
    parents: list[np.ndarray] = []
    options: list[np.ndarray] = []
    scale = float(np.sum(weights * np.max(np.abs(cost), axis=1))) or 1.0
    for u in range(n_units):
        cand_cost = (total_cost[:, None] + weights[u] * cost[u][None, :]).ravel()
        cand_dist = (total_dist[:, None] + distortion[u][None, :]).ravel()
        cand_parent = np.repeat(np.arange(total_cost.size), n_options)
        cand_option = np.tile(np.arange(n_options), total_cost.size)
        # costs on a grid of COST_TOLERANCE x scale, so sums that differ by rounding are one cost
        key = np.round(cand_cost / (COST_TOLERANCE * scale))
        order = np.lexsort((cand_option, cand_parent, cand_dist, key))
        sorted_key = key[order]
        first_of_cost = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
        kept = order[first_of_cost]  # the lowest distortion at each cost
        dist_kept = cand_dist[kept]
        # Pareto: strictly below every cheaper survivor's distortion
        best_before = np.minimum.accumulate(np.r_[np.inf, dist_kept[:-1]])
        survive = dist_kept < best_before
        chosen = kept[survive]
        total_cost, total_dist = cand_cost[chosen], cand_dist[chosen]
        parents.append(cand_parent[chosen])
        options.append(cand_option[chosen])
    choices = np.empty((total_cost.size, n_units), dtype=np.int64)
    point = np.arange(total_cost.size)
    for u in range(n_units - 1, -1, -1):
        choices[:, u] = options[u][point]
        point = parents[u][point]
    return AllocationFrontier(mean_cost=total_cost / weights.sum(), distortion=total_dist, choices=choices)


def solve_allocation(cost: np.ndarray, distortion: np.ndarray, max_mean_cost: float,
                     weights: np.ndarray | None = None) -> tuple[np.ndarray, float, float]:
    """The allocation of least total distortion whose weighted mean cost is at most ``max_mean_cost``.

    Parameters
    ----------
    cost, distortion, weights
        As for :func:`allocation_frontier`.
    max_mean_cost : float
        The budget in bits per value (a uniform option's measured rate, to compare at equal bits).

    Returns
    -------
    choices : ndarray, (U,) int
        The option index per unit.
    distortion : float
        Its predicted total distortion.
    mean_cost : float
        Its weighted mean cost (<= ``max_mean_cost`` up to :data:`COST_TOLERANCE`).

    Raises
    ------
    KvasymError
        When even the cheapest allocation costs more than ``max_mean_cost``.
    """
    frontier = allocation_frontier(cost, distortion, weights)
    slack = COST_TOLERANCE * max(1.0, abs(float(max_mean_cost)))
    affordable = np.nonzero(frontier.mean_cost <= float(max_mean_cost) + slack)[0]
    if affordable.size == 0:
        raise KvasymError(f"no allocation fits {max_mean_cost} bits per value: the cheapest costs "
                          f"{frontier.mean_cost[0]:.6g}")
    best = affordable[-1]  # the frontier's distortion decreases with cost
    return frontier.choices[best].copy(), float(frontier.distortion[best]), float(frontier.mean_cost[best])
