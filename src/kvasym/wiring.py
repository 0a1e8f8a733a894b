"""The DAG's wiring for one config: which jobs exist, the files each reads and writes, the flags
and slices it is given. The Snakefile's rules ask one :class:`Wiring` for all of it.

:class:`Wiring` is built once per Snakemake parse from the config Snakemake read
(``workflow/rules/common.smk``): it validates the config once (schema and defaults, then the
library's cross-field checks, :func:`kvasym.study.load_study`; the ``real`` section,
:func:`kvasym.real.real_settings`; the claims file, :func:`kvasym.claims.load_claims`; the
bring-your-own caches' headers and digests), decides which parts of the study this DAG has
(real-model rows, end-to-end passes of each installed model, long context, passkey, greedy,
card, frontier, sequence-length sweep) and answers the rules' input functions. Nothing here
imports Snakemake: every answer is a plain path, list or string, so the wiring is tested
without a dry run (``tests/test_wiring.py``). An input function takes the job's wildcards as
its first argument, any object with their names as attributes and an ``items()`` method
(Snakemake's ``Wildcards``; :class:`types.SimpleNamespace` with :func:`wildcards` in tests).

Every error is a :class:`kvasym.errors.KvasymError` of one line that names the offending key,
value or file; ``common.smk`` turns it into a ``WorkflowError``.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .artifacts import ARTIFACTS, flag_of, input_flags, model_pattern, path, pattern, stage_flags, template_regex
from .cachefile import file_content_sha256, inspect_cache_file
from .cells import cell_of_path, part_cells, slice_digest
from .claims import claims_files, load_claims
from .config_io import read_yaml_mapping
from .config_schema import validate_config
from .errors import KvasymError
from .real import HEAD_DIM as REAL_HEAD_DIM
from .real import REAL_MODEL_NAME, missing_extra_reason, model_section, real_settings
from .real.evaluate import REAL_DISTRIBUTIONS
from .real.model_registry import MODELS
from .real.model_registry import PRIMARY as PRIMARY_MODEL
from .real.models import missing_reason as model_missing_reason
from .render.crate import crate_slice
from .render.figures.registry import FIGURE_CELL_INPUTS, FIGURE_INPUTS, FORMATS, dag_families, facet_cells
from .render.figures.registry import FIGURE_FAMILIES as FIGURE_REGISTRY
from .render.figures.registry import FIGURES as ALL_FIGURES
from .render.figures.registry import family_cells, figures_slice
from .render.numbers import numbers_slice
from .render.paper_inputs import check_paper_inputs
from .render.reproduce import reproduce_slice
from .render.table_model import PUBLISHED_BANDS
from .render.tables import TABLES as RENDERED_TABLES
from .resources import MODEL_STAGES, SLICE_STAGES, job_resources
from .stages import STAGES, stage_code_digest, stage_module
from .stages._registries import MODEL_JOB_STAGES, model_entry_record
from .stages.paper import LATEX_PACKAGES, have_latex
from .study import canonical_json, load_study

__all__ = ["Wiring", "names_pattern", "wildcards"]

#: The stages whose ``--slice`` is the job's config slice (:meth:`kvasym.study.Study.job_slice`).
JOB_SLICE_STAGES = ("cells", "metrics", "stats", "theory", "file_metrics", "real_metrics", "real_metrics_extra",
                    "e2e", "e2e_join", "e2e_stats", "calibrate", "e2e_long", "passkey", "sensitivity", "card",
                    "greedy")
#: A cell file of a synthetic unit -> the unit folder artifact it lives in (rules cells, metrics).
_UNIT_OF = {"per_query": "per_query_unit", "per_key": "per_key_unit", "packed": "packed_unit"}
#: The e2e_stats tables of every DAG with end-to-end passes, then those of its optional parts.
_E2E_TABLES = ("summary", "comparisons", "equal_bits", "sensitivity", "agreement")
_LONG_TABLES = ("long_summary", "long_positions", "long_comparisons")
_PASSKEY_TABLES = ("passkey_summary",)

LATEX_HINT = ("kvasym: no LaTeX engine found, so the paper PDF is skipped (every generated source is still "
              f"written). Debian: apt-get install {LATEX_PACKAGES}; conda: add texlive-core to environment.yml.")


def names_pattern(names: Iterable[str]) -> str:
    """A wildcard constraint matching exactly ``names`` (none: a pattern that matches nothing)."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


def wildcards(**values: Any) -> SimpleNamespace:
    """A job's wildcards as the input functions take them (attributes and ``items()``), for
    callers outside Snakemake."""
    out = SimpleNamespace(**values)
    out.items = lambda: values.items()  # type: ignore[attr-defined]
    return out


def _wildcard_dict(w: Any) -> dict[str, Any]:
    return dict(w.items()) if w is not None else {}


class Wiring:
    """What the DAG of one config runs and how its jobs are wired.

    Parameters
    ----------
    config : Mapping
        The config Snakemake read (its config files merged, ``--config`` applied), defaults not
        yet filled in.
    configfiles : sequence of path-like
        The config files it came from (the reproduce section and the crate name them).
    paper_dir : path-like
        The paper's sources: a table or figure they use that no rule makes is refused now.

    Raises
    ------
    KvasymError
        One line naming the offending key, value or file (prefixed ``invalid config:`` for the
        config and the files it names).
    """

    def __init__(self, config: Mapping[str, Any], configfiles: Sequence[str | os.PathLike] = (),
                 paper_dir: str | os.PathLike = "paper") -> None:
        try:
            for configfile in configfiles:
                # Snakemake's YAML reader keeps the last of two equal keys silently; ours refuses
                read_yaml_mapping(configfile)
            #: the whole config, validated once, every default filled in
            self.config: dict[str, Any] = validate_config(config)
            self.study = load_study(self.config)  # its own schema pass: a no-op on a filled-in config
        except KvasymError as exc:
            raise KvasymError(f"invalid config: {exc}") from None
        self.configfiles = [os.path.relpath(f) for f in configfiles]
        try:
            # the claims file and those it extends (key extends), read and checked now: a missing
            # or malformed one stops the parse with one line, not a job's traceback or a silent
            # "Nothing to be done" that keeps the old ledger
            self.claims = load_claims(self.study.claims_file, self.study.headline)
            self.claims_files = claims_files(self.study.claims_file)
        except KvasymError as exc:
            raise KvasymError(f"invalid config: claims_file: {exc}") from None
        #: the digest of the code each stage runs (a param of its rules: an edit reruns it)
        self.stage_code = {stage: stage_code_digest(stage) for stage in STAGES}
        #: each figure family's job's code digest (its own drawing modules, not the other families')
        self.figure_code = {family: stage_code_digest("figure", family) for family in FIGURE_REGISTRY}
        #: one line each for the parts of the study skipped (a missing extra or model package)
        self.notices: list[str] = []
        self.headline = self.study.headline
        self._real_rows()
        self._file_cells()
        self._models()
        self._optional_parts()
        # every table the tables stage writes (kvasym.render.tables.TABLES), whatever the
        # config: a table whose part is off is written with its "not in this run" text
        self.tables = [name.removeprefix("table_") for name in RENDERED_TABLES]
        check_paper_inputs(paper_dir, self.tables, ALL_FIGURES)
        self.have_latex = have_latex()
        if not self.have_latex:
            self.notices.append(LATEX_HINT)

    # -----------------------------------------------------------------------------------------
    # what this DAG has

    def _real_rows(self) -> None:
        study = self.study
        try:
            self.real = real_settings(self.config.get("real"), list(study.schemes), list(study.frontier_real_schemes))
        except KvasymError as exc:
            raise KvasymError(f"invalid config: {exc}") from None
        shadowed = sorted((set(study.distributions) | set(study.files)) & set(REAL_DISTRIBUTIONS))
        if shadowed:
            raise KvasymError(f"invalid config: distribution name(s) {shadowed} are reserved for the real-model rows")
        self.real_missing = missing_extra_reason() if self.real else None
        if self.real and self.real_missing:
            self.notices.append(f"kvasym: the real-model rows are skipped: {self.real_missing}")
        self.real_distributions_pattern = names_pattern(REAL_DISTRIBUTIONS)
        #: the shipped texts the real rows capture (rule capture)
        self.real_texts = list(self.real["texts"]) if self.real else []
        self.real_cells = ([(name, REAL_HEAD_DIM) for name in REAL_DISTRIBUTIONS]
                           if self.real and not self.real_missing else [])
        # the real rows' extra budgets (a real_metrics_extra job per cell)
        self.real_extra_budgets = study.real_extra_budgets()
        self.real_extra_schemes_pattern = names_pattern(self.real_extra_budgets)
        self.real_extra_budgets_pattern = names_pattern(
            sorted({str(b) for budgets in self.real_extra_budgets.values() for b in budgets}))
        self.frontier = bool(study.frontier_schemes)
        self.seq_len = bool(study.seq_len_sweep)
        self.cell_units = [name for name in study.distributions if name not in study.query_variants]
        self.variant_units = list(study.query_variants)

    def _file_cells(self) -> None:
        """(name, head_dim) of every bring-your-own cache (kind: file), read from the file headers
        now, so a missing or malformed file stops the DAG before any job runs; and each file's
        content digest, in its cells' slices: a file replaced by another that keeps the old mtime
        (mv, cp -p, rsync -t, tar x) changes the params and so reruns its jobs."""
        self.file_cells = []
        for name, spec in self.study.files.items():
            try:
                layout = inspect_cache_file(spec["params"]["path"])
            except KvasymError as exc:
                raise KvasymError(f"invalid config: distributions[{name}].params.path: {exc}") from None
            self.file_cells.append((name, layout.head_dim))
        self.file_digests = {name: file_content_sha256(spec["params"]["path"])
                             for name, spec in self.study.files.items()}

    def _models(self) -> None:
        """The models of the end-to-end passes: the primary (SmolLM2-135M), then the ``real.models``
        whose files are installed (a notice names what is missing for the others), and each
        one's long-context windows, passkey trials, greedy prompts and card (None when off)."""
        real = self.real
        self.e2e = real["e2e"] if self.real_cells else None
        self.query_aware = bool(self.e2e and self.e2e["query_aware"])
        self.e2e_models = [PRIMARY_MODEL] if self.e2e else []
        for model in (real["models"] if self.e2e else {}):
            missing = model_missing_reason(model)
            if missing:
                self.notices.append(f"kvasym: the end-to-end passes of {model} are skipped: {missing}")
            else:
                self.e2e_models.append(model)
        self.model_sections = {m: model_section(real, m) for m in self.e2e_models}
        self.assembled_stems = sorted(MODELS[m].stem for m in self.e2e_models if MODELS[m].chunked is not None)
        self.long_of = {m: self.model_sections[m]["e2e"]["long_context"] for m in self.e2e_models}
        self.passkey_of = {m: self.model_sections[m]["e2e"]["passkey"] for m in self.e2e_models}
        self.card_of = {m: self.model_sections[m]["card"] for m in self.e2e_models}
        self.greedy_of = {m: self.model_sections[m]["e2e"]["greedy"] for m in self.e2e_models}
        self.long_models = [m for m in self.e2e_models if self.long_of[m]]
        self.passkey_models = [m for m in self.e2e_models if self.passkey_of[m]]
        self.card_models = [m for m in self.e2e_models if self.card_of[m]]
        self.greedy_models = [m for m in self.e2e_models if self.greedy_of[m]]
        # a greedy scheme with statistics over blocks of rows needs its chunk: checked for every
        # configured model, installed or not (one line naming the key)
        for model in [PRIMARY_MODEL, *real["models"]] if real and real["e2e"] else []:
            section = model_section(real, model)
            if section["e2e"]["greedy"]:
                try:
                    self.study.greedy_slice(section)
                except KvasymError as exc:
                    raise KvasymError(f"invalid config: {exc}") from None
        # the primary's card: what the tables, figures and claims read
        self.card = self.card_of.get(PRIMARY_MODEL)
        self.card_outputs = stage_module("card").OUTPUTS  # the card stage declares what it writes
        self.e2e_tables = (*_E2E_TABLES, *(_LONG_TABLES if self.long_models else ()),
                           *(_PASSKEY_TABLES if self.passkey_models else ()))

    def _optional_parts(self) -> None:
        #: the artifacts only some DAGs have, by the part of the study they exist for
        self.optional_parts = {
            "real": bool(self.real_cells), "e2e": bool(self.e2e), "query_aware": self.query_aware,
            "long_context": bool(self.long_models), "passkey": bool(self.passkey_models),
            "greedy": bool(self.greedy_models), "card": bool(self.card), "frontier": self.frontier,
            "seq_len": self.seq_len,
        }
        #: the models each per-model artifact exists for
        self.models_of_part = {"card": self.card_models, "greedy": self.greedy_models}
        self.figure_families = dag_families(bool(self.real_cells), bool(self.e2e), self.frontier,
                                            bool(self.long_of.get(PRIMARY_MODEL)), bool(self.card))
        self.figures_slice = figures_slice(self.study)

    # -----------------------------------------------------------------------------------------
    # slices, resources and flags

    def job_slice(self, stage: str, w: Any) -> dict[str, Any]:
        """The config slice a job of ``stage`` depends on (:meth:`kvasym.study.Study.job_slice`)."""
        return self.study.job_slice(stage, _wildcard_dict(w), real=self.real, file_digests=self.file_digests)

    def cell_table_slice(self, distribution: str, dim: Any, scheme: str, budget: Any) -> dict[str, Any]:
        """The slice a cell's metrics file is made from (:meth:`kvasym.study.Study.cell_table_slice`)."""
        return self.study.cell_table_slice(distribution, dim, scheme, budget, real=self.real,
                                           file_digests=self.file_digests)

    def resources_of(self, stage: str) -> dict[str, Callable[..., int]]:
        """A rule's resources (:func:`kvasym.resources.job_resources`): from the job's slice for
        grid stages and the model-level ones (its model, a window's length), from the input size
        for file_metrics, fixed otherwise; a job with several workers (its threads) asks for
        theirs too."""

        def request(key: str) -> Callable[..., int]:
            def of(w: Any, input: Any, threads: int = 1) -> int:  # noqa: A002 - Snakemake passes it by this name
                sliced = self.job_slice(stage, w) if stage in (*SLICE_STAGES, *MODEL_STAGES) else None
                return job_resources(stage, sliced, input.size_mb if stage == "file_metrics" else 0,
                                     workers=int(threads))[key]

            return of

        return {"mem_mb": request("mem_mb"), "runtime": request("runtime")}

    @staticmethod
    def out_dir(wildcards: Any, output: Any) -> str:
        """The folder of a rule's first output (a param derived from the output, not hardcoded)."""
        return os.path.dirname(output[0])

    def param(self, name: str) -> Callable[[Any], str]:
        """A params function returning the JSON of one of the run-wide slices: ``numbers``,
        ``reproduce``, ``crate``, ``headline``, ``schemes``, ``figures``, ``frontier`` or
        ``seq_len_sweep``."""
        makers: dict[str, Callable[[], Any]] = {
            "numbers": lambda: numbers_slice(self.study, self.headline, self.claims),
            "reproduce": lambda: reproduce_slice(self.study, self.config, self.configfiles),
            "crate": self.crate_slice,
            "headline": lambda: self.headline,
            "schemes": lambda: self.study.scheme_definitions(self.real),
            "figures": lambda: self.figures_slice,
            "frontier": self.study.frontier_slice,
            "seq_len_sweep": self.study.seq_len_sweep_slice,
            "query_variants": lambda: self.study.query_variants,
        }
        make = makers[name]
        return lambda wildcards: canonical_json(make())

    # -----------------------------------------------------------------------------------------
    # a job's command line, derived from its stage's parser

    def stage_params(self, stage: str, raw: Callable[..., str] | str | None = None,
                     **given: Any) -> dict[str, Callable[..., str]]:
        """A rule's params ``config`` and ``args``: the arguments of a job's ``kvasym stage <stage>``
        command, derived from what its rule declares and what the stage's parser takes (no flag is
        spelled in a rule), and what of them is not a file path.

        ``args``: each named input ``x`` of the job becomes ``--x`` (underscores as dashes); each
        named output ``x`` becomes ``--out-x`` where the stage has that flag, else ``--x``; one
        unnamed output becomes ``--out`` where the stage has it (a rule's unnamed inputs and
        outputs are what the job depends on and makes, not flags). ``given`` adds arguments that
        are neither (a constant, or a function of the job called as Snakemake calls params
        functions: ``wildcards`` first, then ``input``/``output`` when it names them) and replaces
        an input of the same name (a job given the files inside the folders it depends on); a
        slice stage's ``--slice`` is the job's config slice (:meth:`job_slice`) unless given.
        ``raw`` is appended as it stands: flags a stage derives from its own declarations
        (:func:`kvasym.artifacts.stage_flags`). A stage with ``--workers`` gets the job's
        ``threads`` (:func:`kvasym.workers.map_ordered`); like the files, it is not recorded in
        ``config``: the results do not depend on it, and ``--cores`` scales it.

        ``config``: the JSON of every given value that is not derived from the job's files (the
        slice, cells, settings; ``raw`` when it is a constant). Snakemake records only such
        params and reruns a job when one changes; a function of ``input`` or ``output`` (as
        ``args`` is) it neither records nor compares.

        Raises
        ------
        KvasymError
            When the job is built (a dry run shows it): a name the stage has no flag for, or a
            flag the stage requires that nothing gives.
        """
        options = _stage_options(stage)
        auto_slice = "--slice" in options and "slice" not in given and stage in JOB_SLICE_STAGES

        def config(wildcards: Any) -> str:
            values = {name: _call(value, wildcards, None, None) for name, value in given.items()
                      if not _derives(value)}
            if auto_slice:
                values["slice"] = self.job_slice(stage, wildcards)
            if stage in MODEL_JOB_STAGES:  # the job's model's registry entry (stages._registries)
                values["model_entry"] = model_entry_record(self.job_model(wildcards))
            if raw is not None and not _derives(raw):
                values["raw"] = _call(raw, wildcards, None, None)
            return canonical_json(values)

        def args(wildcards: Any, input: Any, output: Any, threads: int = 1) -> str:  # noqa: A002 - Snakemake's names
            values: dict[str, Any] = {}  # argument (dest) -> its value or paths

            def add(candidates: Sequence[str], what: str, value: Any) -> None:
                dest = next((c for c in candidates if flag_of(c) in options), None)
                if dest is None:
                    raise KvasymError(f"rule {stage}: {what} has no flag of `kvasym stage {stage}` "
                                      f"(tried {', '.join(map(flag_of, candidates))})")
                values.setdefault(dest, value)

            for name, value in given.items():
                add([name], f"param {name}", _call(value, wildcards, input, output))
            if auto_slice:
                add(["slice"], "its config slice", canonical_json(self.job_slice(stage, wildcards)))
            for name in input.keys():
                add([name], f"input {name}", input[name])
            names = list(output.keys())
            for name in names:
                add([f"out_{name}", name], f"output {name}", output[name])
            if not names and len(output) == 1 and "--out" in options:  # else a param names its folder
                add(["out"], "its output", output[0])
            if "--workers" in options:  # the rule's threads (after Snakemake scaled them to --cores)
                add(["workers"], "its threads", int(threads))
            extra = _call(raw, wildcards, input, output) if raw is not None else ""
            given_flags = {flag_of(dest) for dest in values}
            missing = [flag for flag, required in sorted(options.items())
                       if required and flag not in given_flags and f"{flag} " not in f"{extra} "]
            if missing:
                raise KvasymError(f"rule {stage}: `kvasym stage {stage}` requires {', '.join(missing)}, "
                                  "which no input, output or param of the rule gives")
            # a number is one word, None none (the shared quoting of kvasym.artifacts.input_flags)
            words = {dest: [] if value is None else str(value) if isinstance(value, (int, float)) else value
                     for dest, value in values.items()}
            return " ".join(word for word in [input_flags(words), extra] if word)

        return {"config": config, "args": args}

    # -----------------------------------------------------------------------------------------
    # the synthetic grid and the cells

    def as_inputs(self, paths: Iterable[str]) -> list[str]:
        """Snakemake inputs for cell files: a synthetic cell's file is inside its unit's folder (a
        directory() output of rule cells or metrics), which is the input; a real or file cell's
        file is its own rule's output. The stages are given the files themselves (a param)."""
        out: list[str] = []
        for cell_path in paths:
            item = cell_path
            for cell, unit in _UNIT_OF.items():
                match = template_regex(cell).fullmatch(cell_path)
                if match and match["distribution"] in self.study.distributions:
                    item = path(unit, distribution=match["distribution"], dim=match["dim"])
            if item not in out:
                out.append(item)
        return out

    def variant_packed(self, w: Any) -> str:
        """The packed-caches folder a query-model variant's unit measures: its parent's."""
        return path("packed_unit", distribution=self.study.packed_distribution(w.distribution), dim=w.dim)

    def data_manifests(self) -> list[str]:
        return [path("data", distribution=d, dim=n) for d, n in self.study.data_cells()]

    def metrics_tables(self) -> list[str]:
        """The metrics folders of every unit (each holds its cells' files)."""
        return [path(unit, distribution=d, dim=n) for d, n in self.study.data_cells()
                for unit in ("per_query_unit", "per_key_unit")]

    def cell_paths(self, table: str, w: Any) -> list[str]:
        """Every (scheme, budget) cell file of ``table`` of the job's (distribution, dim)."""
        return [path(table, distribution=w.distribution, dim=w.dim, scheme=s, budget=b)
                for s in self.study.schemes for b in self.study.budgets]

    def per_query_inputs(self, w: Any) -> list[str]:
        return self.cell_paths("per_query", w)

    def per_key_inputs(self, w: Any) -> list[str]:
        return self.cell_paths("per_key", w)

    def per_query_folders(self, w: Any) -> list[str]:
        """The inputs of a stats job: its cells' unit folder (or, for real and file cells, files)."""
        return self.as_inputs(self.per_query_inputs(w))

    def per_key_folders(self, w: Any) -> list[str]:
        """The inputs of a theory job: its unit's per-key folder."""
        return self.as_inputs(self.per_key_inputs(w))

    def metrics_cells(self, w: Any) -> str:
        """The (scheme, budget) each per-query (and per-key) input of a stats or theory job is
        filed under, in the order of :meth:`per_query_inputs`, and the digest of the slice it is
        made from: the stage refuses (and moves aside) a file that holds another cell's table, or
        one made under another configuration (:func:`kvasym.cells.check_provenance`)."""
        return canonical_json([
            {"scheme": s, "budget": b,
             "slice_sha256": slice_digest(self.cell_table_slice(w.distribution, w.dim, s, b))}
            for s in self.study.schemes for b in self.study.budgets])

    def cell_digests(self, paths: Iterable[str]) -> dict[str, str]:
        """The slice digest of each metrics file's cell (the consumer checks its provenance)."""
        return {cell: slice_digest(self.cell_table_slice(**cell_of_path(cell))) for cell in paths}

    def file_cache(self, w: Any) -> str:
        return self.study.files[w.distribution]["params"]["path"]

    # -----------------------------------------------------------------------------------------
    # frontier, sweep, statistics

    def frontier_per_query(self, wildcards: Any = None) -> list[str]:
        """Every scheme's (the grid's and the frontier's) per-query files at every budget, on the
        frontier's synthetic cells (with their schemes' frontier.extra_budgets: files of the same
        unit folders) and the real cells."""
        study = self.study
        synthetic = [(dist, dim, scheme, budget) for dist, dim in study.frontier_data_cells()
                     for scheme in study.frontier_shown_schemes(dist)
                     for budget in study.frontier_budgets(dist, scheme)]
        # the query-aware variants' bases are of post-RoPE queries: post-RoPE rows only
        real = [(dist, dim, scheme, budget) for dist, dim in (self.real_cells if self.frontier else [])
                for scheme in [*study.schemes, *study.frontier_real_schemes,
                               *(study.frontier_real_query_aware if REAL_DISTRIBUTIONS[dist] == "post" else ())]
                for budget in [*study.budgets, *self.real_extra_budgets.get(scheme, ())]]
        return [path("per_query", distribution=dist, dim=dim, scheme=scheme, budget=budget)
                for dist, dim, scheme, budget in [*synthetic, *real]]

    def frontier_cells(self, wildcards: Any = None) -> str:
        """The slice digest of each of :meth:`frontier_per_query`'s files, in order (``--cells`` of
        the frontier stage, which checks every file's provenance against it)."""
        return canonical_json([slice_digest(self.cell_table_slice(**cell_of_path(p)))
                               for p in self.frontier_per_query()])

    def frontier_targets(self) -> list[str]:
        return [pattern("frontier_points"), pattern("frontier_units")] if self.frontier else []

    def e2e_attention_summary(self) -> list[str]:
        """The gathered summary, as rule e2e_stats' input, only where the stage reads it: without
        a frontier. With one, the stage reads the real rows' per-head attention KL from the
        frontier's points (every real scheme's), and waiting for the gathered summary (every stats
        job of the grid, then rule gather) would only lengthen the DAG's longest chain."""
        return [] if self.frontier else [pattern("summary")]

    def seq_len_targets(self) -> list[str]:
        return [pattern(f"seq_len_{name}") for name in ("rows", "summary", "slopes")] if self.seq_len else []

    def gathered_cells(self, kind: str) -> list[tuple[str, int]]:
        """The (distribution, dim) of the stats parts gathered into table ``kind``: every synthetic
        data cell, then the file and real cells; the query-model variants only into the per-trial
        table (claims may name them; no comparison, summary or theory row of theirs)."""
        synthetic = self.study.data_cells() if kind == "trials" else self.study.main_data_cells()
        return [*synthetic, *self.file_cells, *self.real_cells]

    def stats_tables(self, kind: str) -> list[str]:
        """The stats parts gathered into table ``kind`` (:meth:`gathered_cells`)."""
        return [path(f"{kind}_part", distribution=d, dim=n) for d, n in self.gathered_cells(kind)]

    def theory_tables(self) -> list[str]:
        return [path("theory_part", distribution=d, dim=n) for d, n in self.study.main_data_cells()]

    def part_cells(self, artifact: str, parts: Iterable[str]) -> list[dict[str, Any]]:
        """The (distribution, dim) each part (of a stats or theory ``artifact``) is filed under, in
        order, and the digest of the slice of the job that wrote it: a part copied over another,
        or made under another config, is refused (and moved aside) by the gather stage."""
        return part_cells(artifact, parts, self.job_slice)

    def display_inputs(self) -> dict[str, list[str]]:
        """The metrics files stage gather summarises into the figures' display tables
        (:mod:`kvasym.display`): the facet cells' per-query files (every scheme and budget) and
        per-key files (every scheme, the headline budget)."""
        return {f"display_{table}": [
            path(table, distribution=c["distribution"], dim=c["dim"], scheme=s, budget=b)
            for c in facet_cells(self.figures_slice, table) for s in self.study.schemes
            for b in (self.study.budgets if c["budget"] is None else [c["budget"]])]
            for table in ("per_query", "per_key")}

    def gather_flags(self, wildcards: Any, input: Any, output: Any) -> str:  # noqa: A002
        """The ``kvasym stage gather`` flags (:mod:`kvasym.stages.gather`: INPUTS, OUTPUTS,
        LISTINGS): each table's parts, its gathered file and its parts' cells; the query-model
        table and its slice; the display tables, the facet cells' metrics files they summarise,
        those files' cell digests and the rows kept (``gather.DISPLAY_SLICE_KEYS``)."""
        gather = stage_module("gather")
        display = self.display_inputs()  # the metrics files (the rule's input may name their folders)
        display_slice = {key: self.figures_slice[key] for key in gather.DISPLAY_SLICE_KEYS}
        return stage_flags(
            gather,
            {name: display.get(name) or list(input[name]) for name in gather.INPUTS},
            {name: output[name] for name in output.keys()},
            {**{name: self.part_cells(artifact, input[name])
                for name, artifact in gather.INPUTS.items() if name not in display},
             **{name: self.cell_digests(paths) for name, paths in display.items()},
             "query_model": self.study.query_model_slice(),
             **{name: display_slice for name, _ in gather.DISPLAY_OUTPUTS.values()}})

    # -----------------------------------------------------------------------------------------
    # the real-model rows and the model-level stages

    def real_capture_files(self, wildcards: Any = None) -> list[str]:
        """The real-model captures (rule capture), one per configured text."""
        if not self.real_cells:
            raise KvasymError("the real-model rows are not configured or their extra is missing: "
                              f"{self.real_missing or 'add a real: section to the config'}")
        return [path("captures", text=text) for text in self.real["texts"]]

    def real_outputs(self, wildcards: Any, output: Any) -> list[str]:
        """The real_metrics job's ``--out``: BUDGET=FILE for each budget's per-query file."""
        return [f"{budget}={out}" for budget, out in zip(self.study.budgets, output)]

    def real_layers(self, wildcards: Any) -> str:
        return ",".join(map(str, self.real["layers"]))

    def job_model(self, wildcards: Any) -> str:
        """The model a job of a model-level stage runs: its ``{model}``, or the model whose
        assembled file its ``{stem}`` names (rule model_file)."""
        values = _wildcard_dict(wildcards)
        return str(values["model"]) if "model" in values else self.assembled_model(wildcards)

    def assembled_model(self, wildcards: Any) -> str:
        """The model key of an assembled file's job (rule model_file) from its file stem."""
        return next(m for m in self.e2e_models if MODELS[m].stem == wildcards.stem)

    def model_inputs(self, stage: str) -> Callable[[Any], dict[str, str]]:
        """An input function of a model-level stage: the query-aware bases of the job's model (with
        query-aware variants) and its assembled file (a model from chunk packages)."""
        inputs = stage_module(stage).INPUTS

        def present(w: Any) -> dict[str, str]:
            model = _wildcard_dict(w).get("model", PRIMARY_MODEL)
            out = {}
            if "query_bases" in inputs and self.model_sections[model]["e2e"]["query_aware"]:
                out["query_bases"] = path("query_bases", model=model)
            if "model_file" in inputs and MODELS[model].chunked is not None:
                out["model_file"] = path("model_file", stem=MODELS[model].stem)
            return out

        return present

    def e2e_parts(self, w: Any) -> list[str]:
        """The part files of one (model, text), part 0 first (real.e2e.parts; rule e2e)."""
        parts = self.model_sections[w.model]["e2e"]["parts"]
        return [path("e2e_part", model=w.model, text=w.text, part=p) for p in range(parts)]

    def e2e_texts(self, wildcards: Any = None) -> list[str]:
        return [path("e2e_text", model=m, text=text)
                for m in self.e2e_models for text in self.model_sections[m]["e2e"]["texts"]]

    def e2e_long_windows(self, wildcards: Any = None) -> list[str]:
        """The long-context tables of every model with long-context passes, each length's parts."""
        return [path("e2e_long_window", model=m, length=n, part=p) for m in self.long_models
                for n in self.long_of[m]["lengths"] for p in range(self.long_of[m]["parts"])]

    def passkey_tables(self, wildcards: Any = None) -> list[str]:
        """The passkey trial tables of every model with passkey trials, each length's parts."""
        return [path("passkey_trials", model=m, length=n, part=p) for m in self.passkey_models
                for n in self.passkey_of[m]["lengths"] for p in range(self.passkey_of[m]["parts"])]

    def card_sensitivity_parts(self, wildcards: Any = None, model: str | None = None) -> list[str]:
        """One model's card sensitivity tables, each calibration text's parts (its card.parts): the
        input of rule card (the job's wildcards), or of the crate (``model``)."""
        model = model or wildcards.model
        card = self.card_of[model]
        return [path("card_sensitivity", model=model, text=t, part=p)
                for t in card["calibration_texts"] for p in range(card["parts"])]

    @staticmethod
    def e2e_stats_table_name(name: str) -> str:
        """The artifact of an e2e_stats output: e2e_<name>, or <name> for passkey_summary."""
        return name if name.startswith("passkey") else f"e2e_{name}"

    def e2e_targets(self) -> list[str]:
        """The end-to-end tables, when configured (empty otherwise)."""
        return [pattern(self.e2e_stats_table_name(name)) for name in self.e2e_tables] if self.e2e else []

    def greedy_targets(self) -> list[str]:
        """Every model's greedy-agreement tables (none when real.e2e.greedy is off)."""
        return [path(name, model=m) for m in self.greedy_models for name in ("e2e_greedy", "e2e_greedy_summary")]

    def card_targets(self) -> list[str]:
        """Every model's card outputs (none without a card), its page (rule card_page) included."""
        return [path(f"card_{name}", model=m) for m in self.card_models
                for name in [*self.card_outputs, *stage_module("card_page").OUTPUTS]]

    # -----------------------------------------------------------------------------------------
    # optional inputs of the consumers

    @staticmethod
    def primary_pattern(name: str) -> str:
        """The pattern of artifact ``name``, its model wildcard (if any) the primary model."""
        return model_pattern(name, PRIMARY_MODEL)

    @staticmethod
    def optional_of(stage: str) -> tuple[str, ...]:
        """The inputs of ``stage`` (its module's INPUTS) whose artifacts only some DAGs have."""
        inputs = stage_module(stage).INPUTS
        return tuple(name for name in inputs if ARTIFACTS[inputs[name]].when != "always")

    def optional_inputs(self, stage: str) -> Callable[[Any], dict[str, Any]]:
        """An input function: the optional inputs of ``stage`` that this DAG has, by name; a
        per-model artifact the primary model's, or every model's for an input the stage reads per
        model (its module's PER_MODEL)."""
        inputs = stage_module(stage).INPUTS
        per_model = getattr(stage_module(stage), "PER_MODEL", ())

        def present(wildcards: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name in self.optional_of(stage):
                item = ARTIFACTS[inputs[name]]
                if name in per_model:
                    models = self.models_of_part[item.when]
                    if models:
                        out[name] = [path(inputs[name], model=m) for m in models]
                elif self.optional_parts[item.when]:
                    out[name] = self.primary_pattern(inputs[name])
            return out

        return present

    def published_bands_input(self, wildcards: Any) -> dict[str, str]:
        """The published small-model bands (config/published_bands.yaml), only with end-to-end passes."""
        return {"published_bands": PUBLISHED_BANDS} if self.e2e and Path(PUBLISHED_BANDS).is_file() else {}

    def manifests_input(self, wildcards: Any) -> dict[str, list[str]]:
        """The real table's data manifests, only with real rows: the synthetic distributions' at
        the headline dim (their statistics beside the real caches')."""
        if not self.real_cells:
            return {}
        return {"data_manifests": [path("data", distribution=d, dim=n) for d, n in self.study.data_cells()
                                   if n == self.headline["dim"]]}

    # -----------------------------------------------------------------------------------------
    # figures, tables, paper, crate

    def figure_outputs(self) -> dict[str, str]:
        return {f"{name}_{fmt}": path("figure", name=name, format=fmt)
                for names in self.figure_families.values() for name in names for fmt in FORMATS}

    def figure_label(self, family: str) -> str:
        """The cell a family's figures show (the report's "cell" label)."""
        inputs = FIGURE_REGISTRY[family].inputs
        h = self.headline
        if "real_per_query" in inputs:
            return f"{REAL_MODEL_NAME}, d = {REAL_HEAD_DIM}, n = {h['budget']}"
        if "e2e_summary" in inputs:
            return f"{REAL_MODEL_NAME}, end to end, every budget"
        if "e2e_long_positions" in inputs:
            return f"{REAL_MODEL_NAME}, long-context windows"
        if "frontier_points" in inputs:
            return f"frontier cells, sharpness {h['sharpness']:g}, every budget"
        return f"{h['distribution']}, d = {h['dim']}, sharpness {h['sharpness']:g}, n = {h['budget']}"

    def figure_inputs(self, family: str) -> dict[str, Any]:
        """The files one figure family reads (:data:`kvasym.render.figures.registry.FIGURE_FAMILIES`):
        gathered tables, and the metrics files or data manifests of its facet cells only."""
        study = self.study
        cells = family_cells(self.figures_slice, family)
        inputs: dict[str, Any] = {}
        for key in FIGURE_REGISTRY[family].inputs:
            name = FIGURE_INPUTS[key]
            if key == "real_per_query":  # every scheme of every real distribution at the headline budget
                inputs[key] = [path(name, distribution=d, dim=n, scheme=s, budget=self.headline["budget"])
                               for d, n in self.real_cells for s in study.schemes]
            elif key in FIGURE_CELL_INPUTS:  # the family's facet cells
                wildcards_of = ARTIFACTS[name].wildcards
                inputs[key] = [
                    path(name, distribution=c["distribution"], dim=c["dim"], scheme=s, budget=b)
                    for c in cells
                    for s in (study.schemes if "scheme" in wildcards_of else [None])
                    for b in ([None] if "budget" not in wildcards_of
                              else study.budgets if c["budget"] is None else [c["budget"]])]
            else:  # a gathered table
                inputs[key] = self.primary_pattern(name)
        return inputs

    def figure_rule_inputs(self, family: str) -> dict[str, Any]:
        """A figure rule's inputs: :meth:`figure_inputs`, metrics files as their unit folders."""
        return {key: self.as_inputs(paths) if key in ("per_query", "per_key") else paths
                for key, paths in self.figure_inputs(family).items()}

    def figure_flags(self, family: str) -> str:
        """The ``kvasym stage figure`` flags of a family's named input files, with the digest of
        each metrics file's cell (:mod:`kvasym.stages.figure`: INPUTS, LISTINGS)."""
        figure = stage_module("figure")
        inputs = self.figure_inputs(family)
        return stage_flags(figure, inputs, listings={key: self.cell_digests(paths)
                                                     for key, paths in inputs.items() if key in figure.LISTINGS})

    def paper_targets(self) -> list[str]:
        targets = [path("table", name=name) for name in self.tables] + [pattern("numbers"), pattern("reproduce")]
        return targets + [pattern("paper_pdf")] if self.have_latex else targets

    def reproduce_captures(self, wildcards: Any) -> list[str]:
        """The real-model captures whose metadata the reproduce section prints (none without them)."""
        return self.real_capture_files() if self.real_cells else []

    @staticmethod
    def reproduce_forward(wildcards: Any) -> list[str]:
        """The committed forward-pass check (benchmarks/validate_forward.py), when the checkout has it."""
        name = "tests/expected/forward_reference.json"
        return [name] if os.path.isfile(name) else []

    def crate_parts(self) -> list[list[str]]:
        """What the run wrote beyond its targets that its crate lists: the stats and theory parts
        (a claim decided in one cell names its parts), the real and file cells' metrics files, the
        frontier's per-query files, the captures, the real caches' statistics, the end-to-end
        passes' per-text tables and the parts the model jobs wrote."""
        study = self.study
        parts = [self.stats_tables(kind) for kind in ("comparisons", "summary", "trials")]
        parts.append(self.theory_tables())
        parts.append([path("per_query", distribution=d, dim=n, scheme=s, budget=b)
                      for d, n in [*self.file_cells, *self.real_cells] for s in study.schemes for b in study.budgets])
        parts.append(self.as_inputs(self.frontier_per_query()))
        if self.real_cells:
            parts.append(self.real_capture_files())
            parts.append([path("capture_sidecar", text=text) for text in self.real["texts"]])
            parts.append(list(self.optional_inputs("tables")(None).values()))
        if self.e2e:
            # the model jobs' parts, so that each job that computed is an action of the crate
            parts.append(self.e2e_texts())
            parts.append([path("e2e_part", model=m, text=text, part=p) for m in self.e2e_models
                          for text in self.model_sections[m]["e2e"]["texts"]
                          for p in range(self.model_sections[m]["e2e"]["parts"])])
            parts.append(self.e2e_long_windows())
            parts.append(self.passkey_tables())
            parts.append([f for m in self.card_models for f in self.card_sensitivity_parts(model=m)])
        return parts

    def crate_slice(self) -> dict[str, Any]:
        """The crate's slice: the files the run read and who wrote each distribution's metrics."""
        writers = {name: "cells" for name in self.cell_units}
        writers.update({name: "metrics" for name in self.variant_units})
        writers.update({name: "file_metrics" for name, _ in self.file_cells})
        writers.update({name: "real_metrics" for name, _ in self.real_cells})
        return crate_slice(self.config, self.configfiles, self.study.claims_file, writers)



@functools.lru_cache(maxsize=None)
def _stage_options(stage: str) -> dict[str, bool]:
    """Every option string of ``kvasym stage <stage>`` -> whether the stage requires it."""
    parser = argparse.ArgumentParser(prog=f"kvasym stage {stage}")
    stage_module(stage).add_arguments(parser)
    return {option: bool(action.required) for action in parser._actions for option in action.option_strings}


def _call(value: Any, wildcards: Any, input: Any, output: Any) -> Any:  # noqa: A002
    """``value``, or what it returns for the job when it is a function (given the job's wildcards,
    and its input and output when it names them, as Snakemake's params functions are)."""
    if not callable(value):
        return value
    names = inspect.signature(value).parameters
    return value(wildcards, **{k: v for k, v in (("input", input), ("output", output)) if k in names})


def _derives(value: Any) -> bool:
    """Whether a params value is a function of the job's files (Snakemake neither records nor
    compares such a param)."""
    return callable(value) and bool({"input", "output"} & set(inspect.signature(value).parameters))
