"""The sequence-length sweep's table (template ``table_seq_len.tex.j2``): per scheme and budget,
the mean over trials of the mean KL and of the output direction error at each length, and the
slope of log metric on log length with its interval (stage seq_len_sweep, :mod:`kvasym.seqlen`).
Without a sweep the table is empty (``has_sweep`` false)."""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["seq_len_context"]

#: Metric column -> its label in the table.
METRICS = {"kl": "mean KL", "t_eps_dir": "out. dir."}


def seq_len_context(summary: pd.DataFrame | None, slopes: pd.DataFrame | None) -> dict[str, Any]:
    """The template context: ``has_sweep``, the sweep's cell, ``lengths`` and per metric one block
    of rows ``{scheme, budget, cells (one value per length), slope, low, high}``."""
    if summary is None or summary.empty or slopes is None or slopes.empty:
        return {"has_sweep": False}
    first = summary.iloc[0]
    lengths = sorted(int(x) for x in summary["seq_len"].unique())
    blocks = []
    for metric, label in METRICS.items():
        rows = []
        for (scheme, budget), g in summary.groupby(["scheme", "budget"], sort=False):
            by = g.set_index("seq_len")[metric]
            s = slopes[(slopes["scheme"] == scheme) & (slopes["budget"] == budget) & (slopes["metric"] == metric)]
            fit = s.iloc[0] if len(s) else None
            rows.append({"scheme": str(scheme), "budget": int(budget),
                         "cells": [float(by.get(length, float("nan"))) for length in lengths],
                         "slope": float(fit["slope"]) if fit is not None else float("nan"),
                         "low": float(fit["low"]) if fit is not None else float("nan"),
                         "high": float(fit["high"]) if fit is not None else float("nan")})
        rows.sort(key=lambda r: (r["budget"], r["scheme"]))
        blocks.append({"metric": label, "rows": rows})
    return {"has_sweep": True, "distribution": str(first["distribution"]), "dim": int(first["dim"]),
            "sharpness": float(first["sharpness"]), "n_trials": int(summary["n_trials"].min()),
            "lengths": lengths, "blocks": blocks}
