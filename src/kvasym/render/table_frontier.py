"""The frontier table of the paper (``table_frontier``): the best scheme per distribution and budget.

:func:`frontier_context` turns the frontier's points (stage ``frontier``,
:func:`kvasym.frontier.frontier_points`) into the context of ``templates/table_frontier.tex.j2``:
per (distribution, dim) and nominal budget ``n``, the scheme (and the budget it ran at) with the
best mean KL, p99 KL, top-5 recall and output direction error among the points whose MEASURED
total rate is at most ``n + RATE_SLACK`` bits per coordinate (:func:`kvasym.frontier.best_per_budget`),
with its rate and value; and the frontier's side-bit ledger (each scheme's measured side bits per
coordinate at the headline dim). Synthetic rows at the headline sharpness, real rows at the model's
own (1). Without points: ``has_frontier`` False. The rows' budgets, and the ledger's, are the
grid's (:func:`kvasym.frontier.grid_points`): a point at a scheme's ``frontier.extra_budgets``
competes in every allowance it fits but adds no row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..display import side_bit_ledger
from ..frontier import DISTORTIONS, RATE_SLACK, best_per_budget, grid_points

#: The table's distortion columns, in order: points column -> short heading.
COLUMNS: dict[str, str] = {"kl_mean": "mean KL", "kl_p99": "p99 KL", "recall_mean": "recall",
                           "t_eps_dir_mean": "out. dir."}


def frontier_context(points: pd.DataFrame | None, headline: Mapping[str, Any], *,
                     real_distributions: Sequence[str] = (), real_sharpness: float = 1.0) -> dict[str, Any]:
    """The template context of ``table_frontier`` (see the module docstring)."""
    base: dict[str, Any] = {"has_frontier": False, "slack": RATE_SLACK, "columns": list(COLUMNS.values())}
    if points is None or points.empty:
        return base
    real = set(real_distributions)
    sharp = np.where(points["distribution"].isin(real), real_sharpness, float(headline["sharpness"]))
    frame = points[np.isclose(points["sharpness"].to_numpy(dtype=float), sharp)]
    budgets = sorted(int(b) for b in grid_points(frame)["budget"].unique())
    best = {name: best_per_budget(frame, budgets, distortion=name) for name in COLUMNS}
    order = list(dict.fromkeys(frame["distribution"]))
    cells = sorted(frame[["distribution", "dim"]].drop_duplicates().itertuples(index=False, name=None),
                   key=lambda c: (c[0] in real, order.index(c[0]), c[1]))
    groups = []
    for dist, dim in cells:
        rows = []
        for n in budgets:
            entries = []
            for name in COLUMNS:
                b = best[name]
                r = b[(b["distribution"] == dist) & (b["dim"] == dim) & (b["budget"] == n)].iloc[0]
                entries.append({"scheme": str(r["scheme"]), "at": int(r["scheme_budget"]),
                                "bits": float(r["bits_total"]), "value": float(r["value"])})
            rows.append({"budget": n, "allowance": n + RATE_SLACK, "entries": entries})
        groups.append({"distribution": dist, "dim": int(dim), "real": dist in real, "rows": rows})
    # the side-bit ledger at the headline dim: mean measured side bits per coordinate per scheme
    head_dim = int(headline["dim"])
    ledger_frame = grid_points(frame[(frame["dim"] == head_dim) & ~frame["distribution"].isin(real)])
    ledger = side_bit_ledger(ledger_frame)
    from .table_e2e import scheme_order

    rank = {s: i for i, s in enumerate(scheme_order([e["scheme"] for e in ledger]))}
    ledger.sort(key=lambda e: rank[e["scheme"]])
    return {**base, "has_frontier": True, "groups": groups, "budgets": budgets, "ledger": ledger,
            "head_dim": head_dim, "sharpness": float(headline["sharpness"]), "real_sharpness": real_sharpness,
            "distortions": list(DISTORTIONS)}
