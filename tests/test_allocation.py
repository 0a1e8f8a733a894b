"""kvasym.allocation: the multiple-choice knapsack against brute force and known optima."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.allocation import allocation_frontier, solve_allocation
from kvasym.errors import KvasymError


def brute_force(cost, distortion, budget, weights=None):
    """Every allocation enumerated: the least distortion with mean cost <= budget."""
    cost, distortion = np.asarray(cost, float), np.asarray(distortion, float)
    weights = np.ones(cost.shape[0]) if weights is None else np.asarray(weights, float)
    best = (np.inf, None)
    for choice in itertools.product(range(cost.shape[1]), repeat=cost.shape[0]):
        idx = np.arange(cost.shape[0]), np.asarray(choice)
        mean_cost = float(np.sum(weights * cost[idx]) / weights.sum())
        if mean_cost <= budget + 1e-12:
            total = float(distortion[idx].sum())
            if total < best[0]:
                best = (total, choice)
    return best


def test_known_optimum_where_greedy_marginal_analysis_fails():
    """Unit 0's curve is not convex (no gain from 1 to 2 bits, a large one from 2 to 3): greedy
    marginal analysis from (1, 1) at a budget of 2.5 bits raises unit 1 first (gain 1.0 per bit
    against 0 for unit 0), reaching D = 10 + 1 = 11 at (1, 2); the optimum spends both extra
    bits on unit 0: (3, 1) with D = 0.5 + 2 = 2.5 (mean cost (3 + 1) / 2 = 2 <= 2.5; (3, 2)
    costs 2.5 and gives 1.5)."""
    cost = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    distortion = np.array([[10.0, 10.0, 0.5], [2.0, 1.0, 0.9]])
    choices, total, mean_cost = solve_allocation(cost, distortion, 2.5)
    assert choices.tolist() == [2, 1]
    assert total == pytest.approx(1.5)
    assert mean_cost == pytest.approx(2.5)
    choices, total, _ = solve_allocation(cost, distortion, 2.0)
    assert choices.tolist() == [2, 0] and total == pytest.approx(2.5)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 10_000), st.floats(1.0, 4.0))
def test_matches_brute_force(n_units, n_options, seed, budget):
    rng = np.random.default_rng(seed)
    # whole-bit costs plus a common side cost, as measured rates are
    cost = np.sort(rng.integers(1, 5, size=(n_units, n_options)), axis=1) + 0.501953125
    distortion = rng.exponential(size=(n_units, n_options))
    weights = rng.integers(1, 4, size=n_units).astype(float)
    expected, _ = brute_force(cost, distortion, budget + 0.501953125, weights)
    if not np.isfinite(expected):
        with pytest.raises(KvasymError, match="no allocation fits"):
            solve_allocation(cost, distortion, budget + 0.501953125, weights)
        return
    choices, total, mean_cost = solve_allocation(cost, distortion, budget + 0.501953125, weights)
    assert total == pytest.approx(expected, rel=1e-12)
    idx = np.arange(n_units), choices
    assert float(distortion[idx].sum()) == pytest.approx(total)
    assert mean_cost <= budget + 0.501953125 + 1e-9
    assert float(np.sum(weights * cost[idx]) / weights.sum()) == pytest.approx(mean_cost)


def test_frontier_is_pareto_and_complete():
    """Every enumerated allocation is weakly dominated by a frontier point, and frontier points
    do not dominate each other (costs increase, distortions strictly decrease)."""
    rng = np.random.default_rng(3)
    cost = np.tile(np.arange(1.0, 5.0), (5, 1))
    distortion = np.sort(rng.exponential(size=(5, 4)), axis=1)[:, ::-1]
    front = allocation_frontier(cost, distortion)
    assert np.all(np.diff(front.mean_cost) > 0) and np.all(np.diff(front.distortion) < 0)
    for choice in itertools.product(range(4), repeat=5):
        idx = np.arange(5), np.asarray(choice)
        c, d = cost[idx].mean(), distortion[idx].sum()
        assert np.any((front.mean_cost <= c + 1e-12) & (front.distortion <= d + 1e-12))


def test_convex_curves_give_the_lagrangian_hull_points():
    """With convex curves every Lagrangian solution (each unit minimising D + lambda r alone) is
    a frontier point: the frontier is at least as good and reaches each hull point exactly."""
    rng = np.random.default_rng(7)
    widths = np.arange(1.0, 7.0)
    scale = rng.uniform(0.5, 3.0, size=(6, 1))
    distortion = scale * 4.0 ** (-widths)[None, :]  # convex, decreasing: D(b) ~ 4^-b
    cost = np.tile(widths, (6, 1))
    front = allocation_frontier(cost, distortion)
    for lam in (1e-3, 1e-2, 0.05, 0.2):
        choice = np.argmin(distortion + lam * cost, axis=1)
        idx = np.arange(6), choice
        c, d = cost[idx].mean(), distortion[idx].sum()
        at = np.isclose(front.mean_cost, c)
        assert at.any() and front.distortion[at][0] == pytest.approx(d)


def test_refusals():
    with pytest.raises(KvasymError, match="no allocation fits 0.5 bits"):
        solve_allocation([[1.0, 2.0]], [[1.0, 0.0]], 0.5)
    with pytest.raises(KvasymError, match="finite"):
        solve_allocation([[1.0, 2.0]], [[np.nan, 0.0]], 2.0)
    with pytest.raises(KvasymError, match="equal non-empty"):
        allocation_frontier(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(KvasymError, match="weights"):
        allocation_frontier(np.ones((2, 3)), np.ones((2, 3)), weights=[1.0, 0.0])
