"""The figure stage's config slice (:func:`figures_slice`), apart from the drawing code.

The slice is a pure function of the study. It lives in its own module, not in
:mod:`kvasym.render.figures.registry`, so that a stage that needs only the slice (``gather``:
its display tables select their rows by the slice's grid) does not take every figure module
into its code digest (:func:`kvasym.stages.stage_code_digest`): editing the figures' style
redraws the figures and reruns no table.
"""

from __future__ import annotations

from typing import Any

#: The most distributions a faceted figure shows: the headline's and the most extreme of each kind.
MAX_FACETS = 4


def _paper_kl_ratio(study: Any) -> float | None:
    """The ``paper_value`` of the claims file's mean-KL ratio claim of QKQV over KQV (C2 in the
    paper's ledger), or None when the claims file has none."""
    from ...claims import load_claims

    for claim in load_claims(study.claims_file, study.headline):
        where = claim["where"]
        if (claim["statistic"] == "kl_ratio" and where.get("a") == "QKQV" and where.get("b") == "KQV"
                and where.get("which", "mean") == "mean" and claim.get("paper_value") is not None):
            return float(claim["paper_value"])
    return None


def figures_slice(study: Any) -> dict[str, Any]:
    """The figure stage's slice from a :class:`kvasym.study.Study`: the grid, the study's
    headline cell (:attr:`~kvasym.study.Study.headline`), the facet distributions and the
    rank-sweep references (:meth:`kvasym.study.Study.rank_references`)."""
    from ...study import extreme_first  # not at import: the study module loads the config schema

    variants = getattr(study, "query_variants", {})
    distributions = [
        {**study.distributions[name].to_dict(), "dims": list(study.distribution_dims[name])}
        for name in study.distributions if name not in variants
    ]
    head = dict(study.headline)
    dim = int(head["dim"])
    at_dim = [d for d in distributions if dim in d["dims"]]
    facets = [head["distribution"]]
    for kind in ("student_t", "low_rank", "concentrated", "gaussian"):
        for name in extreme_first(at_dim, kind)[:1]:
            if name not in facets and len(facets) < MAX_FACETS:
                facets.append(name)
    return {
        "schemes": list(study.schemes),
        "budgets": list(study.budgets),
        "sharpness": list(study.sharpness),
        "distributions": distributions,
        "base_seed": int(study.base_seed),
        "seq_len": int(study.seq_len),
        "n_queries": int(study.n_queries),
        "trials": int(study.trials),
        "headline": {"distribution": head["distribution"], "dim": dim, "sharpness": float(head["sharpness"]),
                     "budget": int(head["budget"])},
        "facet_distributions": facets,
        # at each dim with low-rank data, its heaviest-tailed Student-t (the rank sweep's lines)
        "rank_references": study.rank_references(),
        "marginal_trials": int(min(study.trials, study.theory.get("trials", study.trials), 4)),
        # the paper's QKQV/KQV mean-KL ratio, a reference line of the sharpness sweep
        "paper_kl_ratio": _paper_kl_ratio(study),
        "jensen_bins": 20,
        "max_points": 300,
    }
