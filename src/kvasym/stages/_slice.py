"""The ``--slice`` of grid stages: the narrow config slice a job depends on.

Snakemake passes it as JSON (built by :class:`kvasym.study.Study`'s ``*_slice`` methods); by
hand, ``--config FILE`` with the cell's ``--distribution``/``--dim`` (and ``--scheme``/
``--budget``) builds the same slice from a config file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import KvasymError
from ..manifest import DATA_KEYS
from ..schemes import Scheme, scheme_from_dict

_DATA_KEYS = set(DATA_KEYS)
#: Keys each stage reads from its slice (what the study's *_slice methods produce).
_UNIT_KEYS = _DATA_KEYS | {"schemes", "budgets", "norm_dtype", "sharpness", "per_key_trials", "packed_schemes"}
SLICE_KEYS: dict[str, set[str]] = {
    # a frontier unit with frontier.extra_budgets also has extra_budgets and packed_extra (optional:
    # Study.unit_slice gives them only there, so that other units keep their slices)
    "cells": _UNIT_KEYS,
    "metrics": _UNIT_KEYS,
    "stats": {"distribution", "dim", "schemes", "scheme_specs", "base_seed", "stats"},
    "theory": _DATA_KEYS | {"budgets", "theory"},
    "real_metrics": {"distribution", "scheme", "budgets", "sharpness", "base_seed", "norm_dtype"},
    # the one budget of an extra cell; the layers always (the DAG's slice has them)
    "real_metrics_extra": {"distribution", "scheme", "budgets", "sharpness", "base_seed", "norm_dtype", "layers"},
    "e2e": {"text", "max_tokens", "schemes", "budgets", "base_seed", "norm_dtype", "e2e"},
    "e2e_join": {"text", "max_tokens", "schemes", "budgets", "base_seed", "norm_dtype", "e2e"},
    "e2e_stats": {"schemes", "study_schemes", "budgets", "base_seed", "n_boot"},
    "calibrate": {"texts", "evaluation_texts", "max_tokens"},
    "e2e_long": {"length", "windows", "calibration_windows", "own", "schemes", "query_variants", "budgets",
                 "base_seed", "norm_dtype"},
    "passkey": {"length", "depths", "trials", "schemes", "query_variants", "budgets", "base_seed", "norm_dtype"},
    "greedy": {"texts", "prompt_tokens", "prompts_per_text", "new_tokens", "schemes", "budgets", "causal_chunks",
               "base_seed", "norm_dtype"},
    "sensitivity": {"text", "evaluation_texts", "max_tokens", "scheme", "widths", "granularity", "base_seed",
                    "norm_dtype"},
    "card": {"texts", "calibration_texts", "max_tokens", "scheme", "budgets", "widths", "granularity", "draws",
             "base_seed", "norm_dtype"},
    "file_metrics": {"distribution", "dim", "scheme", "budget", "sharpness", "n_queries", "base_seed", "norm_dtype"},
}
#: Stages whose slice can also be built from --config and a cell.
_FROM_CONFIG = {"cells": "unit_slice", "metrics": "unit_slice", "stats": "stats_slice", "theory": "theory_slice"}


def parse_slice(text: str, flag: str = "--slice") -> dict[str, Any]:
    """A stage's ``--slice`` argument (JSON object) as a dict, or a KvasymError saying why not
    (naming ``flag``, the argument it came from).

    Here, not in :mod:`kvasym.study` (which re-exports it): a job given ``--slice`` does not
    import the study module, whose import reads the config schema and loads jsonschema."""
    return parse_json_object(text, flag)


def parse_json_object(text: str, flag: str, what: str = "") -> dict[str, Any]:
    """The JSON object of argument ``flag`` as a dict, or a KvasymError naming ``flag`` (and
    ``what`` the object maps, when given) saying why not."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KvasymError(f"{flag} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KvasymError(f"{flag} must be a JSON object" + (f": {what}" if what else ""))
    return data


def parse_cell_digests(text: str | None) -> dict[str, Any] | None:
    """``--cell-digests`` (JSON object: metrics file -> the slice digest of its cell), or None."""
    return None if text is None else parse_json_object(text, "--cell-digests", "metrics file -> slice digest")


def add_slice_arguments(parser: argparse.ArgumentParser, stage: str) -> None:
    """``--slice`` and, for the synthetic grid's stages, ``--config`` with the cell's flags."""
    parser.add_argument("--slice", required=stage not in _FROM_CONFIG,
                        help=f"the {stage} stage's config slice as JSON (Snakemake passes it): "
                        + ", ".join(sorted(SLICE_KEYS[stage])))
    if stage in _FROM_CONFIG:
        parser.add_argument("--config", help="or: a config YAML, with the cell below")
        parser.add_argument("--distribution")
        parser.add_argument("--dim", type=int)


def add_workers_argument(parser: argparse.ArgumentParser) -> None:
    """``--workers N``: processes for the job's independent units (:func:`kvasym.workers.map_ordered`;
    the rule's ``threads``, given by Snakemake). The job's output does not depend on it."""
    from ..workers import parse_workers

    parser.add_argument("--workers", type=parse_workers, default=1,
                        help="processes for the job's independent units (default 1; the results do not depend on it)")


def stage_slice(args: argparse.Namespace, stage: str) -> dict[str, Any]:
    """The slice of ``stage``: ``--slice`` checked for its keys, or built from ``--config``."""
    if args.slice is not None:
        slice_ = parse_slice(args.slice)
        missing = sorted(SLICE_KEYS[stage] - set(slice_))
        if missing:
            raise KvasymError(f"--slice of the {stage} stage lacks key(s) {', '.join(missing)}")
        return slice_
    if getattr(args, "config", None) is None or args.distribution is None or args.dim is None:
        raise KvasymError("give --slice JSON, or --config FILE with --distribution and --dim")
    from ..study import load_study_file

    study = load_study_file(args.config)
    return getattr(study, _FROM_CONFIG[stage])(args.distribution, args.dim)


def hand_run_cells(args: argparse.Namespace, paths: list, cells: list[dict[str, Any]] | None
                   ) -> list[dict[str, Any]] | None:
    """The ``--cells`` of a stage run by hand from ``--config`` (stats, theory), each with the
    ``slice_sha256`` the DAG would give it: the digest of the slice its table is made from in
    that config (:func:`cell_digester`), so that a table made under another configuration is
    refused as the DAG refuses it (issue 51, point 2: a per-query table of base seed 8 was read
    in a base-seed-7 grid, exit 0). Without ``--cells`` the cells come from the files' places in
    the results layout (:func:`kvasym.cells.cell_of_path`); a digest given is kept. With
    ``--slice`` (the DAG's call) the cells are returned as given."""
    if getattr(args, "slice", None) is not None or getattr(args, "config", None) is None:
        return cells
    from ..cells import cell_of_path

    if cells is None:
        cells = [{k: v for k, v in cell_of_path(p).items() if k in ("scheme", "budget")} for p in paths]
    digest = cell_digester(args.config)
    return [cell if "slice_sha256" in cell else
            {**cell, "slice_sha256": digest({"distribution": args.distribution, "dim": args.dim, **cell})}
            for cell in cells]


def cell_digester(config: str | os.PathLike) -> Callable[[Mapping[str, Any]], str]:
    """The digest the DAG gives a cell table's provenance check under ``config``, as a function.

    Parameters
    ----------
    config : path-like
        A config YAML (read once, as :func:`kvasym.study.load_study_file` reads it).

    Returns
    -------
    callable
        ``{distribution, dim, scheme, budget}`` -> :func:`kvasym.cells.slice_digest` of
        :meth:`kvasym.study.Study.cell_table_slice` (what
        :meth:`kvasym.wiring.Wiring.cell_table_slice` gives): the ``real`` section is read only for a real cell,
        a file cell's cache hashed only once.
    """
    from ..cachefile import file_content_sha256
    from ..cells import slice_digest
    from ..config_io import read_yaml_mapping
    from ..real import real_settings
    from ..study import load_study_file

    study = load_study_file(config)

    @functools.cache
    def real() -> dict[str, Any] | None:
        return real_settings(read_yaml_mapping(config).get("real"), list(study.schemes),
                             list(study.frontier_real_schemes))

    @functools.cache
    def file_digest(name: str) -> str:
        return file_content_sha256(study.files[name]["params"]["path"])

    def digest(cell: Mapping[str, Any]) -> str:
        name = cell["distribution"]
        synthetic = name in study.distributions or name in study.files
        files = {name: file_digest(name)} if name in study.files else {}
        return slice_digest(study.cell_table_slice(name, cell["dim"], cell["scheme"], cell["budget"],
                                                   real=None if synthetic else real(), file_digests=files))

    return digest


def config_cell_digests(config: str | os.PathLike, paths: Sequence[str | os.PathLike]) -> dict[str, str]:
    """Each metrics file of ``paths`` -> the digest of its cell's slice under ``config``, the cell
    from the file's place in the results layout (:func:`kvasym.cells.cell_of_path`): the
    ``--cell-digests`` the DAG's rule gives, for a stage run by hand (keyed as
    :func:`kvasym.cells.read_metrics_rows` looks them up). A folder (read whole, not cell by
    cell) has none."""
    from pathlib import Path

    from ..cells import cell_of_path

    digest = cell_digester(config)
    return {str(Path(p)): digest(cell_of_path(p)) for p in paths if not os.path.isdir(p)}


def config_slice(args: argparse.Namespace, build: Callable[[Any], dict[str, Any]], flag: str = "--slice"
                 ) -> dict[str, Any]:
    """A stage's slice: ``flag`` parsed when given (the DAG's call), else ``build`` of the study of
    ``--config`` (the slice the DAG's rule gives, for a run by hand)."""
    given = getattr(args, flag.lstrip("-").replace("-", "_"))
    if given is not None:
        return parse_slice(given, flag)
    if getattr(args, "config", None) is None:
        raise KvasymError(f"give {flag} JSON, or --config FILE")
    from ..study import load_study_file

    return build(load_study_file(args.config))


def add_config_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--config`` of a stage whose slice and cell digests the DAG gives (frontier, gather, figure)."""
    parser.add_argument("--config", default=None,
                        help=f"by hand: a config YAML, from which {what} not given are built as the DAG's "
                             "rule gives them (each input table's provenance is then checked against it)")


def _scheme_of(spec: dict[str, Any]) -> Scheme:
    spec = dict(spec)
    return scheme_from_dict(spec.pop("name"), spec)


def slice_scheme(slice_: dict[str, Any]) -> Scheme:
    """The scheme a slice names: ``slice_["scheme"]`` is ``{"name": ..., "K": ..., "V": ...}``."""
    return _scheme_of(slice_["scheme"])


def slice_schemes(slice_: dict[str, Any]) -> list[Scheme]:
    """The schemes a slice lists: ``slice_["schemes"]``, each ``{"name": ..., "K": ..., "V": ...}``."""
    return [_scheme_of(spec) for spec in slice_["schemes"]]
