"""The figures stage: every figure of the paper from the gathered tables, in one job.

:func:`run_figures` reads the gathered tables (summary, comparisons, theory), the metrics
dataset (per-query and per-key tables, only the rows the figures need) and the data manifests
(to regenerate the keys of the marginal figure with the pipeline's own rotation seeds), draws
every figure of :mod:`kvasym.figures` and writes ``<out_dir>/<name>.pdf`` and ``.png`` for each
``name`` in :data:`FIGURES`.

The slice (:func:`figures_slice`, built from the study and the ``defaults`` of its claims file)
holds everything the figures depend on besides their input files:

``schemes``
    the study's schemes in config order (their colours: :func:`kvasym.figures.scheme_colors`).
``distributions``
    ``[{name, kind, params, dims}]``: the kind and params give nu (tail sweep) and rank (rank
    sweep); name, kind, params and dim rebuild each data slice for the marginal figure.
``base_seed``, ``seq_len``, ``n_queries``, ``trials``
    the data slice's other keys (checked against the manifests).
``headline``
    ``{distribution, dim, sharpness, budget}``: the cell most figures show. From the claims
    file's ``defaults`` where they are in the grid, else the first distribution, its first dim,
    the config's first sharpness, and budget 4 (the paper's headline) or the largest budget.
``facet_distributions``
    the distributions faceted by the Shannon-phi, ECDF, marginal, Jensen and sharpness figures
    (at most 4 at the headline dim: the headline one, then the most extreme instance of each
    other kind: smallest nu, smallest rank, most outlier energy).
``rank_references``
    the heavy-tailed distributions drawn as reference lines in the rank sweep: at each dim
    with low-rank data, the Student-t instance with the smallest nu there.
``marginal_trials``, ``jensen_bins``, ``max_points``
    the marginal figure's trials (one coordinate per key per trial), the Jensen figure's bins,
    and the points per scheme and panel of the Shannon-phi planes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from .errors import KvasymError

#: Figure names, in drawing order; each is written as ``<name>.pdf`` and ``<name>.png``.
FIGURES: tuple[str, ...] = (
    "shannon_phi_k",
    "shannon_phi_v",
    "shannon_phi_t",
    "kl_ecdf",
    "budget_crossover",
    "tail_sweep",
    "rank_sweep",
    "sharpness_sweep",
    "theory_check",
    "marginals",
    "jensen_bias",
)
FORMATS: tuple[str, ...] = ("pdf", "png")
MAX_FACETS = 4
HEADLINE_BUDGET = 4


def figure_files(out_dir: str | os.PathLike) -> list[str]:
    """Every file the stage writes under ``out_dir`` (what a rule declares as outputs)."""
    return [str(Path(out_dir) / f"{name}.{fmt}") for name in FIGURES for fmt in FORMATS]


def claims_defaults(path: str | os.PathLike) -> dict[str, Any]:
    """The ``defaults`` mapping of a claims file ({} if the file or the key is absent)."""
    from .config_io import read_yaml_mapping

    if not Path(path).is_file():
        return {}
    defaults = read_yaml_mapping(path).get("defaults", {})
    return dict(defaults) if isinstance(defaults, Mapping) else {}


def _extreme(specs: Sequence[Mapping[str, Any]], kind: str) -> list[str]:
    """Instances of ``kind`` from the most to the least extreme."""
    items = [s for s in specs if s["kind"] == kind]
    if kind == "student_t":
        items.sort(key=lambda s: float(s["params"]["nu"]))
    elif kind == "low_rank":
        items.sort(key=lambda s: int(s["params"]["rank"]))
    elif kind == "concentrated":
        items.sort(key=lambda s: -float(s["params"]["outlier_scale"]) ** 2 * int(s["params"]["n_outliers"]))
    return [s["name"] for s in items]


def figures_slice(study: Any, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The figures stage's slice from a :class:`kvasym.study.Study` and the claims defaults."""
    defaults = dict(defaults or {})
    distributions = [
        {**study.distributions[name].to_dict(), "dims": list(study.distribution_dims[name])}
        for name in study.distributions
    ]
    names = [d["name"] for d in distributions]
    head = defaults.get("distribution")
    head = head if head in study.distributions else names[0]
    own_dims = list(study.distribution_dims[head])
    dim = defaults.get("dim")
    dim = int(dim) if isinstance(dim, int) and dim in own_dims else own_dims[0]
    sharp = defaults.get("sharpness")
    sharpness = float(sharp) if isinstance(sharp, (int, float)) and any(np.isclose(float(sharp), study.sharpness)) else float(study.sharpness[0])
    budget = defaults.get("budget")
    if not (isinstance(budget, int) and budget in study.budgets):
        budget = HEADLINE_BUDGET if HEADLINE_BUDGET in study.budgets else max(study.budgets)
    at_dim = [d for d in distributions if dim in d["dims"]]
    facets = [head]
    for kind in ("student_t", "low_rank", "concentrated", "gaussian"):
        for name in _extreme(at_dim, kind)[:1]:
            if name not in facets and len(facets) < MAX_FACETS:
                facets.append(name)
    # rank sweep references: at each dim with low-rank data, its heaviest-tailed Student-t
    references: list[str] = []
    for d in sorted({d for spec in distributions if spec["kind"] == "low_rank" for d in spec["dims"]}):
        heaviest = _extreme([spec for spec in distributions if d in spec["dims"]], "student_t")[:1]
        references += [name for name in heaviest if name not in references]
    return {
        "schemes": list(study.schemes),
        "budgets": list(study.budgets),
        "sharpness": list(study.sharpness),
        "distributions": distributions,
        "base_seed": int(study.base_seed),
        "seq_len": int(study.seq_len),
        "n_queries": int(study.n_queries),
        "trials": int(study.trials),
        "headline": {"distribution": head, "dim": dim, "sharpness": sharpness, "budget": int(budget)},
        "facet_distributions": facets,
        "rank_references": references,
        "marginal_trials": int(min(study.trials, study.theory.get("trials", study.trials), 4)),
        "jensen_bins": 20,
        "max_points": 300,
    }


def _files(value: Any) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [Path(value)]
    return [Path(v) for v in value]


def _read_metrics(inputs: Mapping[str, Any], table: str, keep: Mapping[str, Any]) -> pd.DataFrame:
    """Rows of a metrics table matching ``keep`` (column -> allowed values), file by file so
    the whole table never sits in memory. ``inputs[table]`` lists the files (or names a
    directory), else ``inputs['metrics']`` is the dataset root (``results/metrics``)."""
    from .dataset import SCHEMAS, read_table

    sources = _files(inputs.get(table))
    if not sources and inputs.get("metrics") is not None:
        frames = [read_table(inputs["metrics"], table)]
    else:
        frames = []
        for src in sources:
            if src.is_dir():
                frames.append(pq.read_table(src, schema=SCHEMAS[table]).to_pandas())
            else:
                frames.append(pq.read_table(src).to_pandas())
    out = []
    for frame in frames:
        mask = np.ones(len(frame), dtype=bool)
        for column, allowed in keep.items():
            if allowed is None:
                continue
            values = frame[column].to_numpy()
            if column == "sharpness":
                mask &= np.isclose(values.astype(float)[:, None], np.asarray(allowed, dtype=float)[None, :]).any(axis=1)
            else:
                mask &= np.isin(values, list(allowed))
        out.append(frame[mask])
    if not out:
        raise KvasymError(f"the figures stage needs the {table} metrics (inputs['{table}'] or inputs['metrics'])")
    return pd.concat(out, ignore_index=True)


def _manifest_path(inputs: Mapping[str, Any], name: str, dim: int) -> Path | None:
    for path in _files(inputs.get("data")):
        if path.is_dir():
            candidate = path / name / f"d{dim}.json"
            if candidate.is_file():
                return candidate
        elif path.name == f"d{dim}.json" and path.parent.name == name:
            return path
    return None


def marginal_samples(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, int]]:
    """Rotated key coordinates of each facet distribution at the headline dim, regenerated
    from the data slice, checked against the manifest, rotated with the K-side rotation seed
    of the pipeline (``derived_seed(base, "rotation", name, dim, trial, "K")``)."""
    from .pipeline import load_manifest, verified_trial
    from .seeds import derived_seed
    from .theory import rotated_marginal_sample

    specs = {d["name"]: d for d in slice_["distributions"]}
    dim = int(slice_["headline"]["dim"])
    base = int(slice_["base_seed"])
    out: dict[str, tuple[np.ndarray, int]] = {}
    for name in slice_["facet_distributions"]:
        spec = specs[name]
        path = _manifest_path(inputs, name, dim)
        if path is None:
            continue
        data_slice = {
            "distribution": {k: spec[k] for k in ("name", "kind", "params")},
            "dim": dim,
            "seq_len": int(slice_["seq_len"]),
            "n_queries": int(slice_["n_queries"]),
            "trials": int(slice_["trials"]),
            "base_seed": base,
        }
        digests = load_manifest(path, data_slice)
        parts, work = [], dim
        for trial in range(min(int(slice_["marginal_trials"]), int(slice_["trials"]))):
            data = verified_trial(data_slice, trial, digests)
            sample, work = rotated_marginal_sample(data.keys, derived_seed(base, "rotation", name, dim, trial, "K"))
            parts.append(sample)
        if parts:
            out[name] = (np.concatenate(parts), int(work))
    return out


def run_figures(slice_: Mapping[str, Any], inputs: Mapping[str, Any], out_dir: str | os.PathLike) -> list[Path]:
    """Draw every figure of :data:`FIGURES`; returns the files written (pdf and png each).

    ``inputs``: ``summary``, ``theory`` (required) and ``comparisons`` (optional: CIs of the
    sharpness sweep) gathered Parquet files; ``per_query`` and ``per_key`` (lists of metrics
    files, or directories) or ``metrics`` (the dataset root, read with
    :func:`kvasym.dataset.read_table`); ``data`` (manifest files, or the ``results/data``
    directory) for the marginal figure.
    """
    from . import figures as fg

    for key in ("summary", "theory"):
        if inputs.get(key) is None:
            raise KvasymError(f"the figures stage needs inputs['{key}']")
    head = slice_["headline"]
    dist, dim, sharp, budget = head["distribution"], int(head["dim"]), float(head["sharpness"]), int(head["budget"])
    facets = list(slice_["facet_distributions"])
    colors = fg.scheme_colors(slice_["schemes"])
    summary = pd.read_parquet(inputs["summary"])
    theory = pd.read_parquet(inputs["theory"])
    comparisons = pd.read_parquet(inputs["comparisons"]) if inputs.get("comparisons") else None
    per_query = _read_metrics(inputs, "per_query", {"dim": [dim], "sharpness": [sharp], "distribution": facets})
    per_key = _read_metrics(inputs, "per_key", {"dim": [dim], "sharpness": [sharp], "budget": [budget], "distribution": facets})
    specs = slice_["distributions"]
    nu = {d["name"]: float(d["params"]["nu"]) for d in specs if d["kind"] == "student_t"}
    rank = {d["name"]: int(d["params"]["rank"]) for d in specs if d["kind"] == "low_rank"}
    common = dict(sharpness=sharp, dim=dim, distributions=facets, colors=colors)
    drawers = {
        "shannon_phi_k": lambda: fg.shannon_phi_plane(per_query, "k", max_points=slice_["max_points"], seed=slice_["base_seed"], **common),
        "shannon_phi_v": lambda: fg.shannon_phi_plane(per_query, "v", max_points=slice_["max_points"], seed=slice_["base_seed"], **common),
        "shannon_phi_t": lambda: fg.shannon_phi_plane(per_query, "t", max_points=slice_["max_points"], seed=slice_["base_seed"], **common),
        "kl_ecdf": lambda: fg.kl_ecdf(per_query, **common),
        "budget_crossover": lambda: fg.budget_crossover(summary, distribution=dist, dim=dim, sharpness=sharp, colors=colors),
        "tail_sweep": lambda: fg.tail_sweep(summary, nu, dim=dim, budget=budget, sharpness=sharp, colors=colors),
        "rank_sweep": lambda: fg.rank_sweep(summary, rank, slice_["rank_references"], budget=budget, sharpness=sharp, colors=colors),
        "sharpness_sweep": lambda: fg.sharpness_sweep(summary, dim=dim, budget=budget, distributions=facets, comparisons=comparisons, colors=colors),
        "theory_check": lambda: fg.theory_check(theory, dim=dim, distributions=[d["name"] for d in specs if dim in d["dims"]]),
        "marginals": lambda: fg.marginals(marginal_samples(slice_, inputs)),
        "jensen_bias": lambda: fg.jensen_bias(per_key, budget=budget, sharpness=sharp, dim=dim, distributions=facets,
                                              slopes=theory, n_bins=int(slice_["jensen_bins"]), colors=colors),
    }
    assert list(drawers) == list(FIGURES)
    out = Path(out_dir)
    written: list[Path] = []
    for name in FIGURES:
        written.extend(fg.save_figure(drawers[name](), out / name))
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kvasym stage figures`` (what workflow/rules/figures.smk passes)."""
    parser.add_argument("--slice", required=True, help="the figures slice as JSON (Snakemake passes it)")
    parser.add_argument("--summary", required=True)
    parser.add_argument("--comparisons")
    parser.add_argument("--theory", required=True)
    parser.add_argument("--per-query", dest="per_query", nargs="+", required=True)
    parser.add_argument("--per-key", dest="per_key", nargs="+", required=True)
    parser.add_argument("--data", nargs="+", default=[], help="data manifests (for the marginal figure)")
    parser.add_argument("--out-dir", dest="out_dir", required=True)


def run_from_args(args: argparse.Namespace) -> list[Path]:
    """Run the stage from parsed :func:`add_arguments` flags."""
    from .study import parse_slice

    slice_ = parse_slice(args.slice)
    inputs = {k: getattr(args, k) for k in ("summary", "comparisons", "theory", "per_query", "per_key", "data")}
    written = run_figures(slice_, inputs, args.out_dir)
    for path in written:
        print(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvasym.figures_stage`` (same flags as ``kvasym stage figures``)."""
    parser = argparse.ArgumentParser(prog="kvasym stage figures", description="draw every figure of the study")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run_from_args(args)
    except KvasymError as exc:
        print(f"kvasym: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
