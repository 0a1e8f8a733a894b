"""Stage ``figure`` (rules ``figure_<family>``): the figures of the paper, one job per family.

:func:`run_figures` reads the gathered tables (summary, comparisons, theory), the metrics
dataset (per-query and per-key tables, only the rows the figures need) and the data manifests
(to regenerate the keys of the marginal figure with the pipeline's own rotation seeds), draws
the figures of the requested :data:`FAMILIES` with :mod:`kvasym.figures` and writes
``<out_dir>/<name>.pdf`` and ``.png`` for each of their names. Each family reads only its
:data:`FAMILY_INPUTS`, so the DAG runs one small job per family.

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
    with low-rank data, the Student-t instance with the smallest nu there (the query-model
    figure's denominators).
``query_variants``
    ``[{name, kind, params, query, keys_of, dims}]``: the query-model variants of the low-rank
    distributions (:mod:`kvasym.study`), drawn by the query-model figure from the gathered
    per-trial table; they are not in ``distributions``.
``marginal_trials``, ``jensen_bins``, ``max_points``
    the marginal figure's trials (one coordinate per key per trial), the Jensen figure's bins,
    and the points per scheme and panel of the Shannon-phi planes.

The real-model heat map (family ``real_heatmap``) reads the per-query files of the real rows
(:data:`kvasym.real.evaluate.REAL_DISTRIBUTIONS`) at the headline budget; it exists in the DAG
only when the real rows do (:func:`dag_families`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ..artifacts import add_input_arguments
from ..errors import DamagedFile, KvasymError
from ..figure_registry import FAMILIES, FAMILY_INPUTS, FIGURE_CELL_INPUTS, FIGURE_INPUTS, FIGURES, _check_families
from ..real import REAL_SHARPNESS

def _files(value: Any) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [Path(value)]
    return [Path(v) for v in value]


def _read_metrics(inputs: Mapping[str, Any], table: str, keep: Mapping[str, Any]) -> pd.DataFrame:
    """Rows of a metrics table matching ``keep`` (column -> allowed values), file by file so
    the whole table never sits in memory. ``inputs[table]`` lists the files (or names a
    directory), else ``inputs['metrics']`` is the dataset root (``results/metrics``). Each
    listed file must hold one cell that no other file holds, the cell its path files it under
    (:func:`kvasym.cells.check_cell_file`, :func:`kvasym.cells.cell_of_path`): a cell's file
    copied over another's would otherwise be drawn under the other's label; with
    ``inputs['cell_digests']`` (path -> :func:`kvasym.cells.slice_digest`, the DAG's), its
    provenance must be this configuration's."""
    from ..cells import cell_of_path, check_cell_file, check_provenance
    from ..dataset import read_parquet_checked, read_table, read_table_folder

    digests = inputs.get("cell_digests") or {}

    sources = _files(inputs.get(table))
    if not sources and inputs.get("metrics") is None:
        raise KvasymError(f"the figures stage needs the {table} metrics (inputs['{table}'] or inputs['metrics'])")
    seen: dict[tuple, Any] = {}
    out = []
    for src in sources or [None]:
        if src is None:
            frame = read_table(inputs["metrics"], table)
        elif src.is_dir():
            frame = read_table_folder(src, table)
        else:
            frame = read_parquet_checked(src)
            # it must hold the cell its path in the results layout files it under
            check_cell_file(frame, src, table.replace("_", "-"), ("distribution", "dim", "scheme", "budget"), seen,
                            **cell_of_path(src))
            if str(src) in digests:  # the DAG's digest of the cell's slice (issue 33, point 7)
                check_provenance(src, str(digests[str(src)]), table.replace("_", "-"))
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
    return pd.concat(out, ignore_index=True)


#: The columns the real heat map reads from a real per-query file.
REAL_COLUMNS: tuple[str, ...] = ("distribution", "scheme", "budget", "sharpness", "trial", "kl")


def read_trial_map(path: str | os.PathLike, metadata: Mapping[bytes, bytes] | None) -> pd.DataFrame:
    """The ``trial_map`` of a real per-query file (``trial``, ``layer``, ``kv_head``; one row
    per trial) from its Parquet key-value ``metadata``; a :class:`KvasymError` naming the file
    when it is absent or malformed."""
    raw = (metadata or {}).get(b"trial_map")
    if raw is None:
        raise KvasymError(f"{path}: no trial_map in the Parquet metadata (real-model per-query files, written by "
                          "kvasym.real.evaluate.run_real_metrics, map each trial to its text, layer and KV head)")
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise KvasymError(f"{path}: its trial_map is not valid JSON ({exc})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise KvasymError(f"{path}: its trial_map must be a JSON list of {{trial, text, layer, kv_head}} objects")
    wanted = ["trial", "layer", "kv_head"]
    if not entries:
        return pd.DataFrame({k: np.zeros(0, dtype=np.int64) for k in wanted})
    frame = pd.DataFrame(entries)
    absent = [k for k in wanted if k not in frame.columns or frame[k].isna().any()]
    if absent:
        raise KvasymError(f"{path}: its trial_map lacks {', '.join(absent)} for some trial")
    frame = frame[wanted]
    numeric = frame.apply(pd.to_numeric, errors="coerce")
    if (numeric.isna().any().any()
            or not np.all(numeric.to_numpy(dtype=float) == np.round(numeric.to_numpy(dtype=float)))):
        raise KvasymError(f"{path}: its trial_map has a trial, layer or kv_head that is not an integer")
    frame = numeric.astype(np.int64)
    if frame["trial"].duplicated().any():
        raise KvasymError(f"{path}: its trial_map lists trial "
                          f"{int(frame.loc[frame['trial'].duplicated(), 'trial'].iloc[0])} twice")
    return frame


def real_kl_means(files: Any, *, budget: int, sharpness: float = REAL_SHARPNESS) -> pd.DataFrame:
    """Mean per-query KL per (distribution, scheme, layer, KV head) of real per-query files
    (:func:`kvasym.real.evaluate.run_real_metrics`) at ``budget`` and ``sharpness`` (1: the
    model's own attention): the mean over every query (query head, position) of every text,
    each query weighing the same. Reads only :data:`REAL_COLUMNS` and the ``trial_map``
    (trial -> text, layer, KV head) of each file; a file without the map, without a column, or
    with a trial absent from its map is a :class:`KvasymError` naming the file.

    Returns columns ``distribution``, ``scheme``, ``budget``, ``layer``, ``kv_head``,
    ``kl_mean`` and ``n_queries``, sorted.
    """
    import pyarrow as pa

    out_columns = ["distribution", "scheme", "budget", "layer", "kv_head", "kl_mean", "n_queries"]
    keys = ["distribution", "scheme", "layer", "kv_head"]
    parts = []
    for path in _files(files):
        try:
            source = pq.ParquetFile(path)
            schema = source.schema_arrow
        except (OSError, pa.ArrowException) as exc:
            raise DamagedFile(path, f"not a readable real per-query file ({exc})") from None
        absent = [c for c in REAL_COLUMNS if c not in schema.names]
        if absent:
            raise KvasymError(f"{path}: no column(s) {', '.join(absent)} (not a per-query metrics file?)")
        trial_map = read_trial_map(path, schema.metadata)
        try:
            frame = source.read(columns=list(REAL_COLUMNS)).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            raise DamagedFile(path, f"not a readable real per-query file ({exc})") from None
        trials = np.unique(frame["trial"].to_numpy())
        unmapped = np.setdiff1d(trials, trial_map["trial"].to_numpy())
        if unmapped.size:
            shown = ", ".join(map(str, unmapped[:5].tolist())) + (", ..." if unmapped.size > 5 else "")
            raise KvasymError(f"{path}: trial(s) {shown} are not in its trial_map "
                              f"({unmapped.size} of {trials.size} trials)")
        keep = ((frame["budget"].to_numpy() == int(budget))
                & np.isclose(frame["sharpness"].to_numpy(dtype=float), float(sharpness)))
        sums = (frame[keep].groupby(["distribution", "scheme", "trial"], sort=False)["kl"]
                .agg(kl_sum="sum", n_queries="count").reset_index())
        parts.append(sums.merge(trial_map, on="trial", how="left", validate="many_to_one"))
    if not parts:
        return pd.DataFrame({c: [] for c in out_columns})
    pooled = pd.concat(parts, ignore_index=True).groupby(keys, sort=True)[["kl_sum", "n_queries"]].sum().reset_index()
    pooled = pooled[pooled["n_queries"] > 0]
    pooled["kl_mean"] = pooled["kl_sum"] / pooled["n_queries"]
    pooled["budget"] = int(budget)
    return (pooled[out_columns].astype({"layer": np.int64, "kv_head": np.int64, "n_queries": np.int64})
            .reset_index(drop=True))


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
    from ..manifest import load_manifest, verified_trial
    from ..seeds import derived_seed
    from ..theory import rotated_marginal_sample

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


def run_figures(slice_: Mapping[str, Any], inputs: Mapping[str, Any], out_dir: str | os.PathLike,
                families: Sequence[str] | None = None) -> list[Path]:
    """Draw the figures of ``families`` (default: every family of :data:`FAMILIES`); returns
    the files written (pdf and png each).

    ``inputs`` (only those of :data:`FAMILY_INPUTS` for the families drawn are read):
    ``summary``, ``theory`` and ``comparisons`` (optional for the sharpness sweep: its CIs)
    gathered Parquet files; ``per_query`` and ``per_key`` (lists of metrics files, or
    directories) or ``metrics`` (the dataset root, read with :func:`kvasym.dataset.read_table`);
    ``data`` (manifest files, or the ``results/data`` directory) for the marginal figure;
    ``real_per_query`` (the real rows' per-query files at the headline budget) for the real heat
    map (without them it says there is nothing to show).
    """
    from .. import figures as fg
    from .. import figures_e2e as fe
    from .. import figures_frontier as ff
    from ..dataset import read_parquet_checked
    from ..real import REAL_MODEL_NAME
    from ..real.evaluate import REAL_DISTRIBUTIONS

    families = list(FAMILIES) if families is None else _check_families(families)
    needed = {key for family in families for key in FAMILY_INPUTS[family]}
    for key in ("summary", "theory"):
        if key in needed and inputs.get(key) is None:
            raise KvasymError(f"the figures {', '.join(f for f in families if key in FAMILY_INPUTS[f])} "
                              f"need inputs['{key}'] (--{key})")
    head = slice_["headline"]
    dist, dim, sharp, budget = head["distribution"], int(head["dim"]), float(head["sharpness"]), int(head["budget"])
    facets = list(slice_["facet_distributions"])
    colors = fg.scheme_colors(slice_["schemes"])
    # each input is read once, and only if a family drawn here needs it
    summary = read_parquet_checked(inputs["summary"]) if "summary" in needed else None
    theory = read_parquet_checked(inputs["theory"]) if "theory" in needed else None
    comparisons = (read_parquet_checked(inputs["comparisons"]) if "comparisons" in needed and inputs.get("comparisons")
                   else None)
    trials = read_parquet_checked(inputs["trials"]) if "trials" in needed and inputs.get("trials") else None
    per_query = (_read_metrics(inputs, "per_query", {"dim": [dim], "sharpness": [sharp], "distribution": facets})
                 if "per_query" in needed else None)
    per_key = (_read_metrics(inputs, "per_key",
                             {"dim": [dim], "sharpness": [sharp], "budget": [budget], "distribution": facets})
               if "per_key" in needed else None)
    real = real_kl_means(inputs.get("real_per_query"), budget=budget) if "real_per_query" in needed else None
    frontier = (read_parquet_checked(inputs["frontier_points"])
                if "frontier_points" in needed and inputs.get("frontier_points") else None)
    e2e = {name: read_parquet_checked(inputs[f"e2e_{name}"]) if f"e2e_{name}" in needed and inputs.get(f"e2e_{name}")
           else None for name in ("summary", "sensitivity")}
    specs = slice_["distributions"]
    nu = {d["name"]: float(d["params"]["nu"]) for d in specs if d["kind"] == "student_t"}
    rank = {d["name"]: int(d["params"]["rank"]) for d in specs if d["kind"] == "low_rank"}
    common = dict(sharpness=sharp, dim=dim, distributions=facets, colors=colors)
    shannon = dict(max_points=slice_["max_points"], seed=slice_["base_seed"], **common)
    drawers = {
        "shannon_phi_k": lambda: fg.shannon_phi_plane(per_query, "k", **shannon),
        "shannon_phi_v": lambda: fg.shannon_phi_plane(per_query, "v", **shannon),
        "shannon_phi_t": lambda: fg.shannon_phi_plane(per_query, "t", **shannon),
        "kl_ecdf": lambda: fg.kl_ecdf(per_query, **common),
        "budget_crossover": lambda: fg.budget_crossover(summary, distribution=dist, dim=dim, sharpness=sharp,
                                                        colors=colors),
        "tail_sweep": lambda: fg.tail_sweep(summary, nu, dim=dim, budget=budget, sharpness=sharp, colors=colors),
        "rank_sweep": lambda: fg.rank_sweep(summary, rank, slice_["rank_references"], budget=budget, sharpness=sharp,
                                            colors=colors),
        "query_model": lambda: _query_model(slice_, trials, budget, sharp),
        "sharpness_sweep": lambda: fg.sharpness_sweep(summary, dim=dim, budget=budget, distributions=facets,
                                                      comparisons=comparisons, colors=colors,
                                                      paper_ratio=slice_.get("paper_kl_ratio")),
        "theory_check": lambda: fg.theory_check(theory, dim=dim,
                                                distributions=[d["name"] for d in specs if dim in d["dims"]]),
        "marginals": lambda: fg.marginals(marginal_samples(slice_, inputs), ks_rows=theory, dim=dim),
        "jensen_bias": lambda: fg.jensen_bias(per_key, budget=budget, sharpness=sharp, dim=dim, distributions=facets,
                                              slopes=theory, n_bins=int(slice_["jensen_bins"]), colors=colors),
        "real_kl_heatmap": lambda: _real_heatmap(real, slice_["schemes"], budget),
        "e2e_ppl_bits": lambda: fe.e2e_ppl_bits(e2e["summary"], colors=colors, model=REAL_MODEL_NAME),
        "e2e_layer_sensitivity": lambda: fe.e2e_layer_sensitivity(e2e["sensitivity"], schemes=slice_["schemes"],
                                                                  model=REAL_MODEL_NAME),
        **{name: (lambda name=name: ff.frontier_figure(frontier, name, sharpness=sharp, real_sharpness=REAL_SHARPNESS,
                                                       real_distributions=list(REAL_DISTRIBUTIONS), colors=colors))
           for name in ff.FRONTIER_FIGURES},
    }
    assert list(drawers) == list(FIGURES)
    from ..dataset import provenance

    from ..atomic import write_text_atomic
    from ..figure_captions import CAPTION_SUFFIX, caption_tex

    out = Path(out_dir)
    written: list[Path] = []
    for family in families:
        for name in FAMILIES[family]:
            # every file says what made it: version, commit, the slice (with its base seed)
            meta = {"figure": name, **provenance(slice_)}
            fig = drawers[name]()
            # the caption's facts (cell, panels, lines shown), read from the figure just drawn
            caption = out / f"{name}.{CAPTION_SUFFIX}"
            write_text_atomic(caption_tex(fig) + "\n", caption)
            written.extend(fg.save_figure(fig, out / name, meta))
            written.append(caption)
    return written


def _query_model(slice_: Mapping[str, Any], trials: pd.DataFrame | None, budget: int, sharpness: float) -> Any:
    """The query-model figure: C5's statistic for KQV (the claim's scheme; else the first scheme)
    under each query model of the low-rank distributions (slice ``query_variants``)."""
    from .. import figures as fg

    parents = {d["name"]: d["params"] for d in slice_["distributions"] if d["kind"] == "low_rank"}
    variants = {v["name"]: {"of": v["keys_of"], "query": v["query"]} for v in slice_.get("query_variants", [])}
    scheme = "KQV" if "KQV" in slice_["schemes"] else slice_["schemes"][0]
    frame = trials if trials is not None else pd.DataFrame(columns=["distribution", "dim", "scheme", "budget",
                                                                    "sharpness", "kl"])
    points = fg.query_model_points(frame, parents, variants, slice_["rank_references"], scheme=scheme, budget=budget,
                                   sharpness=sharpness)
    return fg.query_model_sweep(points, scheme=scheme, budget=budget, sharpness=sharpness)


def _real_heatmap(means: pd.DataFrame, schemes: Sequence[str], budget: int) -> Any:
    """The real heat map: rows the real distributions (keys quantized after RoPE, then before),
    columns the study's schemes in config order."""
    from .. import figures as fg
    from ..real import REAL_MODEL_NAME
    from ..real.evaluate import REAL_DISTRIBUTIONS

    labels = {name: f"{name}\n({mode}-RoPE keys)" for name, mode in REAL_DISTRIBUTIONS.items()}
    order = sorted(REAL_DISTRIBUTIONS, key=lambda name: REAL_DISTRIBUTIONS[name] != "post")
    return fg.real_kl_heatmap(means, distributions=order, schemes=list(schemes), budget=budget, row_labels=labels,
                              model=REAL_MODEL_NAME)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = FIGURE_INPUTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kvasym stage figure`` (what workflow/rules/figures.smk passes)."""
    parser.add_argument("--slice", required=True, help="the figures slice as JSON (Snakemake passes it)")
    parser.add_argument("--family", dest="families", action="append", choices=list(FAMILIES),
                        help="draw only this figure family (repeatable; default: every family)")
    add_input_arguments(parser, FIGURE_INPUTS, many=FIGURE_CELL_INPUTS,
                        notes={"trials": "the query-model figure", "data": "the marginal figure",
                               "real_per_query": "the real heat map: every scheme at the headline budget"})
    parser.add_argument("--cell-digests", dest="cell_digests", default=None,
                        help="JSON object: each --per-query/--per-key file -> the digest of its cell's slice "
                             "(kvasym.cells.slice_digest); the file's provenance must match")
    parser.add_argument("--out-dir", dest="out_dir", required=True)


def run_from_args(args: argparse.Namespace) -> list[Path]:
    """Run the stage from parsed :func:`add_arguments` flags."""
    from ._slice import parse_slice

    slice_ = parse_slice(args.slice)
    inputs: dict[str, Any] = {k: getattr(args, k) for k in FIGURE_INPUTS}
    if args.cell_digests is not None:
        import json

        try:
            inputs["cell_digests"] = json.loads(args.cell_digests)
        except ValueError as exc:
            raise KvasymError(f"--cell-digests is not valid JSON ({exc})") from None
        if not isinstance(inputs["cell_digests"], dict):
            raise KvasymError("--cell-digests must be a JSON object: metrics file -> slice digest")
    written = run_figures(slice_, inputs, args.out_dir, args.families)
    for path in written:
        print(path)
    return written


def run(args: argparse.Namespace) -> None:
    run_from_args(args)  # prints each file written
