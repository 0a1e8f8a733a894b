"""The catalogue of the DAG's files: every artifact declared once, with its path and its writer.

Each :class:`Artifact` names one kind of file (or folder) the DAG writes: its path template
relative to the working directory (``results/`` for the intermediates, ``paper/`` for the
generated TeX and the PDF), the stage (= rule = ``kvasym stage`` subcommand) that writes it,
the Parquet schema it has when one is declared, and the part of the study it exists for
(``when``: every DAG, or only with real-model rows, end-to-end passes, a frontier or a
sequence-length sweep).

Who reads the table:

- the DAG's wiring (:mod:`kvasym.wiring`) and the rules ask it for their paths (:func:`path`,
  :func:`pattern`) and for a consumer's input flags (:func:`input_flags`);
- the stages declare their inputs by artifact name (:func:`add_input_arguments`): their flags,
  help texts and which of their arguments are DAG intermediates (moved aside when damaged,
  :func:`kvasym.stages.move_aside_damaged`) follow from it;
- :mod:`kvasym.render.claims` (which file each claim reads), :mod:`kvasym.render.reproduce`,
  the expected-results tool and the tests read the same paths.

A path template uses Snakemake's wildcard syntax (``{distribution}``, ``{dim}``, ``{scheme}``,
``{budget}``, ``{text}``, ``{name}``), so :func:`pattern` is a rule's output as it stands and
:func:`path` fills it in. Every job's log and benchmark file follow from its stage's job key
(:data:`JOB_KEYS`, :func:`log_path`, :func:`benchmark_path`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ARTIFACTS", "BENCHMARKS_FOLDER", "DAG_FOLDER", "GENERATED_FOLDER", "JOB_KEYS", "LOGS_FOLDER",
           "Artifact", "add_input_arguments", "artifact", "benchmark_path", "flag_of", "folder_of", "input_flags",
           "log_path", "path", "pattern", "stage_flags", "template_regex", "under_results"]

#: The folder the DAG writes its intermediates under (a damaged one is moved aside only here).
DAG_FOLDER = "results"
#: The folder of the paper's generated TeX parts (DAG outputs the paper's sources \input).
GENERATED_FOLDER = "paper/generated"

#: Parts of the study an artifact exists for; "always" is every DAG.
WHEN = ("always", "real", "e2e", "query_aware", "long_context", "passkey", "greedy", "card", "frontier", "seq_len",
        "latex")


@dataclass(frozen=True)
class Artifact:
    """One kind of DAG file.

    Attributes
    ----------
    name : str
        The artifact's name (a consumer stage's argument takes it as its name where one
        artifact is all it is given, :func:`add_input_arguments`).
    template : str
        Its path relative to the working directory, with Snakemake wildcards in braces.
    writers : tuple of str
        The stages that write it (one for most; the metrics tables of a cell have one writer per
        kind of distribution).
    description : str
        What it holds, in a phrase (the consumers' ``--help`` and the catalogue's docs).
    when : str
        The part of the study it exists for (:data:`WHEN`).
    schema : str or None
        ``"module:ATTRIBUTE"`` of its Parquet schema (a :class:`pyarrow.Schema` or a sequence of
        required column names) when one is declared; :meth:`columns` resolves it.
    folder : bool
        A folder written whole (a Snakemake ``directory()`` output, its files named in the
        catalogue as artifacts of their own) rather than a file.
    """

    name: str
    template: str
    writers: tuple[str, ...]
    description: str
    when: str = "always"
    schema: str | None = None
    folder: bool = False

    @property
    def wildcards(self) -> tuple[str, ...]:
        """The wildcards of :attr:`template`, in order."""
        return tuple(field for _, field, _, _ in string.Formatter().parse(self.template) if field)

    def path(self, **wildcards: Any) -> str:
        """The path of one instance: :attr:`template` with every wildcard filled in."""
        missing = [w for w in self.wildcards if w not in wildcards]
        if missing:
            raise KeyError(f"artifact {self.name}: no value for wildcard(s) {missing}")
        return self.template.format(**wildcards)

    def columns(self) -> tuple[str, ...] | None:
        """The column names of :attr:`schema`, or None when none is declared."""
        if self.schema is None:
            return None
        module, _, attribute = self.schema.partition(":")
        value = getattr(importlib.import_module(module), attribute)
        return tuple(getattr(value, "names", value))


_R = DAG_FOLDER
_CELL = "{distribution}/d{dim}"
#: The stages that write per-query cell files: the synthetic units, the real rows, the file caches.
_CELL_WRITERS = ("cells", "metrics", "real_metrics", "real_metrics_extra", "file_metrics")
_ARTIFACTS: tuple[Artifact, ...] = (
    # the synthetic grid's units (stage cells; a query-model variant's, stage metrics)
    Artifact("data", f"{_R}/data/{_CELL}.json", ("cells", "metrics"),
             "the data manifest of a (distribution, dim): trial seeds, digests and statistics"),
    Artifact("packed_unit", f"{_R}/packed/{_CELL}", ("cells",),
             "the packed-caches folder of a (distribution, dim) unit (<scheme>/n<budget>.npz)", folder=True),
    Artifact("packed", f"{_R}/packed/{_CELL}/{{scheme}}/n{{budget}}.npz", ("cells",),
             "the packed caches of one cell (every trial)"),
    Artifact("per_query_unit", f"{_R}/metrics/per_query/{_CELL}", ("cells", "metrics"),
             "the per-query metrics folder of a (distribution, dim) unit (<scheme>/n<budget>.parquet)",
             folder=True),
    Artifact("per_key_unit", f"{_R}/metrics/per_key/{_CELL}", ("cells", "metrics"),
             "the per-key metrics folder of a (distribution, dim) unit (<scheme>/n<budget>.parquet)",
             folder=True),
    Artifact("per_query", f"{_R}/metrics/per_query/{_CELL}/{{scheme}}/n{{budget}}.parquet",
             _CELL_WRITERS,
             "the per-query metrics of one cell", schema="kvasym.dataset:PER_QUERY_SCHEMA"),
    Artifact("per_key", f"{_R}/metrics/per_key/{_CELL}/{{scheme}}/n{{budget}}.parquet", ("cells", "metrics"),
             "the per-key metrics of one cell", schema="kvasym.dataset:PER_KEY_SCHEMA"),
    Artifact("metrics_dataset", f"{_R}/metrics/per_query", _CELL_WRITERS,
             "the metrics dataset: every cell's per-query table (pd.read_parquet of the folder)", folder=True),
    # real-model rows
    Artifact("captures", f"{_R}/real/captures/{{text}}.npz", ("capture",),
             "the real K, V and queries of one shipped text", when="real"),
    Artifact("capture_sidecar", f"{_R}/real/captures/{{text}}.json", ("capture",),
             "the capture's metadata (model, layers, token count, digests)", when="real"),
    Artifact("real_cachestats", f"{_R}/real/cachestats.parquet", ("real_cachestats",),
             "the real caches' statistics per text, layer and head", when="real",
             schema="kvasym.real.cachestats:COLUMNS"),
    Artifact("model_file", f"{_R}/models/{{stem}}.gguf", ("model_file",),
             "a model's GGUF file assembled from the chunk packages pip installed (kvasym.real.models)",
             when="e2e"),
    Artifact("e2e_part", f"{_R}/real/e2e/parts/{{model}}/{{text}}/part{{part}}.parquet", ("e2e",),
             "one job's share of the end-to-end passes of one model over one text (real.e2e.parts)",
             when="e2e", schema="kvasym.real.endtoend_stats:REQUIRED_COLUMNS"),
    Artifact("e2e_text", f"{_R}/real/e2e/texts/{{model}}/{{text}}.parquet", ("e2e_join",),
             "the end-to-end passes of one model over one text, per position, scheme, budget and layer set",
             when="e2e",
             schema="kvasym.real.endtoend_stats:REQUIRED_COLUMNS"),
    Artifact("query_bases", f"{_R}/real/e2e/query_bases/{{model}}.npz", ("calibrate",),
             "the query-aware bases of one model: per layer and KV head, the eigenbasis of the queries' second "
             "moment on the calibration texts", when="query_aware"),
    Artifact("e2e_long_window", f"{_R}/real/e2e/long/{{model}}/L{{length}}/part{{part}}.parquet", ("e2e_long",),
             "one job's share of the long-context passes of one window length (real.e2e.long_context.parts), "
             "per window, position, scheme and budget",
             when="long_context", schema="kvasym.real.endtoend_stats:REQUIRED_COLUMNS"),
    Artifact("passkey_trials", f"{_R}/real/e2e/passkey/{{model}}/L{{length}}/part{{part}}.parquet", ("passkey",),
             "one job's share of the passkey trials of one length (real.e2e.passkey.parts): per pass, depth and "
             "trial, whether the key was retrieved",
             when="passkey", schema="kvasym.real.passkey_grid:GRID_COLUMNS"),
    Artifact("e2e_greedy", f"{_R}/real/e2e/greedy/{{model}}/prompts.parquet", ("greedy",),
             "greedy-decode agreement per text, prompt, scheme and budget, beside the teacher-forced KL and top-1 "
             "flips on the same positions", when="greedy"),
    Artifact("e2e_greedy_summary", f"{_R}/real/e2e/greedy/{{model}}/summary.parquet", ("greedy",),
             "greedy-decode agreement per scheme and budget (texts as units), beside the teacher-forced measures",
             when="greedy", schema="kvasym.real.greedy:SUMMARY_COLUMNS"),
    Artifact("e2e_summary", f"{_R}/real/e2e/summary.parquet", ("e2e_stats",),
             "the end-to-end summary (llama.cpp's measures and the bits per value) per scheme and budget", when="e2e"),
    Artifact("e2e_comparisons", f"{_R}/real/e2e/comparisons.parquet", ("e2e_stats",),
             "the end-to-end paired scheme comparisons at the same budget", when="e2e"),
    Artifact("e2e_equal_bits", f"{_R}/real/e2e/equal_bits.parquet", ("e2e_stats",),
             "the end-to-end scheme comparisons at equal total bits per value (interpolated in rate)", when="e2e"),
    Artifact("e2e_sensitivity", f"{_R}/real/e2e/sensitivity.parquet", ("e2e_stats",),
             "the end-to-end layer sensitivity", when="e2e"),
    Artifact("e2e_agreement", f"{_R}/real/e2e/agreement.parquet", ("e2e_stats",),
             "the rank agreement of attention-level and end-to-end damage", when="e2e"),
    Artifact("e2e_long_summary", f"{_R}/real/e2e/long_summary.parquet", ("e2e_stats",),
             "the long-context measures per scheme, budget and window length (windows as units)", when="long_context"),
    Artifact("e2e_long_positions", f"{_R}/real/e2e/long_positions.parquet", ("e2e_stats",),
             "the long-context next-token KL per scheme, budget and span of positions (damage against context)",
             when="long_context"),
    Artifact("e2e_long_comparisons", f"{_R}/real/e2e/long_comparisons.parquet", ("e2e_stats",),
             "every long-context scheme against RKV at the same budget per window length (paired by window)",
             when="long_context"),
    Artifact("passkey_summary", f"{_R}/real/e2e/passkey_summary.parquet", ("e2e_stats",),
             "passkey accuracy per pass, length and depth, with McNemar's test against full precision",
             when="passkey"),
    # the model card and its measured allocation (issue 32)
    Artifact("card_sensitivity", f"{_R}/real/card/{{model}}/sensitivity/{{text}}/part{{part}}.parquet",
             ("sensitivity",),
             "one job's share of the sensitivity curves of one calibration text (real.card.parts): per allocation "
             "unit and width, the next-token KL with that unit alone quantized", when="card",
             schema="kvasym.real.mixed:SENSITIVITY_COLUMNS"),
    Artifact("card_heads", f"{_R}/real/card/{{model}}/heads.parquet", ("card",),
             "the per-layer and per-KV-head cache statistics of the calibration texts", when="card",
             schema="kvasym.real.card:HEAD_COLUMNS"),
    Artifact("card_measurements", f"{_R}/real/card/{{model}}/measurements.json", ("card",),
             "what the card's own passes measured (JSON): the card without its frontier and recommendations",
             when="card"),
    Artifact("card_json", f"{_R}/real/card/{{model}}/card.json", ("card_page",),
             "the model card (JSON): the measurements with the end-to-end frontier and the recommendations",
             when="card"),
    Artifact("card_html", f"{_R}/real/card/{{model}}/card.html", ("card_page",), "the model card as one HTML page",
             when="card"),
    Artifact("card_allocation", f"{_R}/real/card/{{model}}/allocation.parquet", ("card",),
             "the measured allocation: the width of every unit at every budget", when="card",
             schema="kvasym.real.mixed:ALLOCATION_COLUMNS"),
    Artifact("card_allocation_tied", f"{_R}/real/card/{{model}}/allocation_tied.parquet", ("card",),
             "the measured allocation with one width per layer (K and V tied), from the same sensitivities: "
             "what K != V widths add (empty at granularity layer)", when="card",
             schema="kvasym.real.mixed:ALLOCATION_COLUMNS"),
    Artifact("card_layers", f"{_R}/real/card/{{model}}/layers.parquet", ("card",),
             "the calibration texts' mean sensitivity per layer, K/V side and width", when="card"),
    Artifact("card_passes", f"{_R}/real/card/{{model}}/passes.parquet", ("card",),
             "the uniform and allocated passes over the end-to-end texts, per position", when="card",
             schema="kvasym.real.endtoend_stats:REQUIRED_COLUMNS"),
    Artifact("card_summary", f"{_R}/real/card/{{model}}/summary.parquet", ("card",),
             "the uniform and allocated passes' summary (llama.cpp's measures)", when="card"),
    Artifact("card_comparisons", f"{_R}/real/card/{{model}}/comparisons.parquet", ("card",),
             "the allocation against the uniform map at equal total bits: paired ratios and tests", when="card"),
    # statistics, per (distribution, dim), then gathered
    Artifact("comparisons_part", f"{_R}/stats/comparisons/{_CELL}.parquet", ("stats",),
             "the scheme-pair tests of one (distribution, dim)"),
    Artifact("summary_part", f"{_R}/stats/summary/{_CELL}.parquet", ("stats",),
             "the per-cell summaries of one (distribution, dim)"),
    Artifact("trials_part", f"{_R}/stats/trials/{_CELL}.parquet", ("stats",),
             "the per-trial means of one (distribution, dim)"),
    Artifact("theory_part", f"{_R}/theory/{_CELL}.parquet", ("theory",),
             "the theory checks of one (distribution, dim)"),
    Artifact("comparisons", f"{_R}/stats/comparisons.parquet", ("gather",),
             "the gathered scheme-pair tests, Holm-adjusted"),
    Artifact("summary", f"{_R}/stats/summary.parquet", ("gather",), "the gathered per-cell summaries"),
    Artifact("trials", f"{_R}/stats/trials.parquet", ("gather",), "the gathered per-trial means"),
    Artifact("query_model", f"{_R}/stats/query_model.parquet", ("gather",),
             "C5's ratio under each query model, with the claims' interval (the query-model figure's points)",
             schema="kvasym.claims:QUERY_MODEL_COLUMNS"),
    Artifact("theory", f"{_R}/theory/theory.parquet", ("gather",), "the gathered theory checks"),
    # the figures' display aggregates (kvasym.display), from the facet cells' metrics rows
    Artifact("phi_summary", f"{_R}/stats/display/shannon_phi.parquet", ("gather",),
             "the Shannon-phi planes' quartiles and density levels per site, cell and scheme",
             schema="kvasym.display:PHI_SUMMARY_COLUMNS"),
    Artifact("phi_density", f"{_R}/stats/display/shannon_phi_density.parquet", ("gather",),
             "the Shannon-phi planes' density grids", schema="kvasym.display:PHI_DENSITY_COLUMNS"),
    Artifact("jensen_bins", f"{_R}/stats/display/jensen_bins.parquet", ("gather",),
             "the Jensen figure's binned means of the per-key points", schema="kvasym.display:JENSEN_BIN_COLUMNS"),
    Artifact("frontier_points", f"{_R}/frontier/points.parquet", ("frontier",),
             "the rate-distortion frontier's points (measured total bits against damage)", when="frontier"),
    Artifact("frontier_units", f"{_R}/frontier/units.parquet", ("frontier",),
             "the frontier's per-unit values (trial or text)", when="frontier"),
    Artifact("seq_len_rows", f"{_R}/seq_len_sweep/rows.parquet", ("seq_len_sweep",),
             "the sequence-length sweep's per-trial rows", when="seq_len"),
    Artifact("seq_len_summary", f"{_R}/seq_len_sweep/summary.parquet", ("seq_len_sweep",),
             "the sequence-length sweep's summary per length", when="seq_len"),
    Artifact("seq_len_slopes", f"{_R}/seq_len_sweep/slopes.parquet", ("seq_len_sweep",),
             "the sequence-length sweep's log-log slopes", when="seq_len"),
    # the ledger, the figures, the paper
    Artifact("claims_json", f"{_R}/claims/claims.json", ("claims",), "the claims ledger"),
    Artifact("claims_md", f"{_R}/claims/claims.md", ("claims",), "the claims ledger as Markdown"),
    Artifact("claims_html", f"{_R}/claims/claims.html", ("claims",), "the claims ledger for the report"),
    Artifact("claims_tex", f"{GENERATED_FOLDER}/claims.tex", ("claims",), "the claims ledger's LaTeX macros"),
    Artifact("figure", f"{_R}/figures/{{name}}.{{format}}", ("figure",),
             "one figure's drawing (pdf, png) or the factual part of its caption (caption.tex)"),
    Artifact("table", f"{GENERATED_FOLDER}/table_{{name}}.tex", ("tables",), "one of the paper's LaTeX tables"),
    Artifact("numbers", f"{GENERATED_FOLDER}/numbers.tex", ("numbers",),
             "a macro for every number and name the paper's prose quotes"),
    Artifact("reproduce", f"{GENERATED_FOLDER}/reproduce.tex", ("reproduce",),
             "the reproduction section: commands, commit, hashes, versions, job costs"),
    Artifact("paper_pdf", "paper/build/main.pdf", ("paper",), "the paper", when="latex"),
    # provenance: the crate's root is the checkout, so its metadata file stands there (RO-Crate 1.3)
    Artifact("crate", "ro-crate-metadata.json", ("crate",),
             "the run as a Workflow Run RO-Crate: every file, job and claim with what it was computed from"),
)
#: Every artifact by name, in DAG order.
ARTIFACTS: dict[str, Artifact] = {a.name: a for a in _ARTIFACTS}

#: Each stage's job key: its log is ``results/logs/<key>.log`` and its benchmark file
#: ``results/benchmarks/<key>.tsv``, with the job's wildcards filled in.
JOB_KEYS: dict[str, str] = {
    "cells": f"cells/{_CELL}",
    "metrics": f"metrics/{_CELL}",
    "capture": "real/capture",
    "real_metrics": f"real/metrics/{_CELL}/{{scheme}}",
    "real_metrics_extra": f"real/metrics/{_CELL}/{{scheme}}/n{{budget}}",
    "real_cachestats": "real/cachestats",
    "model_file": "models/{stem}",
    "e2e": "real/e2e/{model}/{text}/part{part}",
    "e2e_join": "real/e2e_join/{model}/{text}",
    "calibrate": "real/calibrate/{model}",
    "e2e_long": "real/e2e_long/{model}/L{length}/part{part}",
    "passkey": "real/passkey/{model}/L{length}/part{part}",
    "greedy": "real/greedy/{model}",
    "e2e_stats": "real/e2e_stats",
    "sensitivity": "real/sensitivity/{model}/{text}/part{part}",
    "card": "real/card/{model}",
    "card_page": "real/card_page/{model}",
    "file_metrics": f"files/{_CELL}/{{scheme}}/n{{budget}}",
    "stats": f"stats/{_CELL}",
    "theory": f"theory/{_CELL}",
    "frontier": "frontier",
    "seq_len_sweep": "seq_len_sweep",
    "gather": "gather",
    "claims": "claims",
    "figure": "figures/{family}",
    "tables": "tables",
    "numbers": "numbers",
    "reproduce": "reproduce",
    "paper": "paper",
    "crate": "crate",
}


def artifact(name: str) -> Artifact:
    """The artifact ``name``; a KeyError names the unknown one and the known ones."""
    try:
        return ARTIFACTS[name]
    except KeyError:
        raise KeyError(f"no artifact {name!r} in the catalogue (known: {', '.join(ARTIFACTS)})") from None


def pattern(name: str) -> str:
    """The path template of artifact ``name``, wildcards unfilled (a rule's output)."""
    return artifact(name).template


def model_pattern(name: str, model: str) -> str:
    """The pattern of artifact ``name`` with its ``model`` wildcard filled in (the others left
    open); the pattern itself when it has none (a file shared by every model)."""
    return pattern(name).replace("{model}", model)


def path(name: str, /, **wildcards: Any) -> str:
    """The path of one instance of artifact ``name`` (a wildcard may itself be called name)."""
    return artifact(name).path(**wildcards)


#: Every job's log is under this folder, its benchmark file (Snakemake's benchmark:) under the next.
LOGS_FOLDER = f"{DAG_FOLDER}/logs"
BENCHMARKS_FOLDER = f"{DAG_FOLDER}/benchmarks"


def _job_key(stage: str, fixed: Mapping[str, Any]) -> str:
    key = JOB_KEYS[stage]
    for wildcard, value in fixed.items():
        if "{" + wildcard + "}" not in key:
            raise KeyError(f"stage {stage}: its job key {key!r} has no wildcard {wildcard!r}")
        key = key.replace("{" + wildcard + "}", str(value))
    return key


def under_results(name: str) -> str:
    """The path template of artifact ``name`` relative to the results folder (:data:`DAG_FOLDER`)."""
    template = artifact(name).template
    if not template.startswith(DAG_FOLDER + "/"):
        raise KeyError(f"artifact {name} ({template}) is not under {DAG_FOLDER}/")
    return template.removeprefix(DAG_FOLDER + "/")


def folder_of(name: str) -> str:
    """The fixed folder a file artifact ``name``'s instances live under (up to its first wildcard)."""
    return artifact(name).template.split("{", 1)[0].rsplit("/", 1)[0]


def log_path(stage: str, **fixed: Any) -> str:
    """The log template of a job of ``stage``; ``fixed`` fills some wildcards in (a rule made
    per value, as the figure families are)."""
    return f"{LOGS_FOLDER}/{_job_key(stage, fixed)}.log"


def benchmark_path(stage: str, **fixed: Any) -> str:
    """The benchmark-file template of a job of ``stage`` (``fixed`` as for :func:`log_path`)."""
    return f"{BENCHMARKS_FOLDER}/{_job_key(stage, fixed)}.tsv"


def flag_of(dest: str) -> str:
    """The command-line flag of argument ``dest``: ``--`` and its name, underscores as dashes."""
    return "--" + dest.replace("_", "-")


def add_input_arguments(parser: argparse.ArgumentParser, inputs: Mapping[str, str], *,
                        required: Iterable[str] = (), many: Iterable[str] = (),
                        notes: Mapping[str, str] | None = None) -> None:
    """Declare a stage's input flags from the catalogue.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The stage's subparser.
    inputs : mapping
        Argument name (``args`` attribute; the flag is ``--<name with dashes>``) -> the artifact
        it is given: the stage module's ``INPUTS``, whose names are its DAG intermediates
        (:func:`kvasym.stages.intermediate_inputs`: a damaged one is moved aside).
    required : iterable of str
        The arguments every run gives; the others are optional (their artifact's ``when``
        says in which DAGs they exist).
    many : iterable of str
        The arguments that take one or more paths (``nargs="+"``).
    notes : mapping, optional
        Argument name -> a few words added to its help (what the stage uses it for).
    """
    required, many, notes = set(required), set(many), dict(notes or {})
    unknown = (required | many | set(notes)) - set(inputs)
    if unknown:
        raise KeyError(f"add_input_arguments: {sorted(unknown)} are not among the inputs {sorted(inputs)}")
    for dest, name in inputs.items():
        item = artifact(name)
        when = "" if item.when == "always" or dest in required else f"; only with {_WHEN_WORDS[item.when]}"
        note = f" ({notes[dest]})" if dest in notes else ""
        parser.add_argument(flag_of(dest), dest=dest, required=dest in required,
                            nargs="+" if dest in many else None, default=[] if dest in many else None,
                            help=f"{item.description}{note}: {item.template} (stage {'/'.join(item.writers)}){when}")


_WHEN_WORDS = {
    "real": "real-model rows",
    "e2e": "the end-to-end passes", "query_aware": "real.e2e.query_aware",
    "long_context": "real.e2e.long_context", "passkey": "real.e2e.passkey", "greedy": "real.e2e.greedy",
    "card": "real.card",
    "frontier": "frontier.schemes", "seq_len": "seq_len_sweep.seq_lens",
    "latex": "a LaTeX engine",
}


def input_flags(named: Mapping[str, str | Sequence[str]]) -> str:
    """A consumer's command-line input flags: ``--<name> PATH...`` for each named input
    (argument name -> one path or a sequence of them; an empty sequence gives no flag), each
    path shell-quoted."""
    import shlex

    flags = []
    for dest, paths in named.items():
        paths = [paths] if isinstance(paths, str) else list(paths)
        if not paths:
            continue
        flags.append(" ".join([flag_of(dest), *(shlex.quote(str(p)) for p in paths)]))
    return " ".join(flags)


def stage_flags(module: Any, inputs: Mapping[str, str | Sequence[str]] | None = None,
                outputs: Mapping[str, str] | None = None, listings: Mapping[str, Any] | None = None) -> str:
    """A job's ``kvasym stage`` flags, derived from what its stage declares (each path and JSON
    value shell-quoted): no flag name is spelled outside the stage module.

    Parameters
    ----------
    module : module
        The stage's module (:func:`kvasym.stages.stage_module`), which declares ``INPUTS``
        (argument -> artifact), optionally ``OUTPUTS`` (argument -> artifact) and ``LISTINGS``
        (input or output argument -> the argument that lists what its files are made from: their
        cells and slice digests, or the slice an output is made under).
    inputs : mapping, optional
        Input argument (a key of ``INPUTS``) -> its path or paths, in the order the flags take;
        an empty sequence gives no flag.
    outputs : mapping, optional
        Artifact -> path, as the job's rule names its outputs; each becomes the ``OUTPUTS``
        argument of that artifact.
    listings : mapping, optional
        Input argument, or output artifact, -> the JSON-able value of its ``LISTINGS`` argument
        (an empty one gives no flag; mappings of several arguments that share one listing
        argument are merged).

    Returns
    -------
    str
        The flags: each input, followed by its output (the argument ``out_<input>``, a stage that
        makes one file of each input) and by its listing; then the other outputs, each with its
        listing; then the listings the stage declares for several arguments, merged.
    """

    from .study import canonical_json

    declared_in = dict(getattr(module, "INPUTS", {}))
    declared = getattr(module, "OUTPUTS", {})  # e2e_stats's is a tuple of its tables' names
    declared_out = {made: dest for dest, made in declared.items()} if isinstance(declared, Mapping) else {}
    listing_of = dict(getattr(module, "LISTINGS", {}))
    inputs, outputs, listings = dict(inputs or {}), dict(outputs or {}), dict(listings or {})
    stage = module.__name__.rsplit(".", 1)[-1]
    for given, declared, what in ((inputs, declared_in, "input argument"), (outputs, declared_out, "output artifact")):
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise KeyError(f"stage {stage}: {unknown} are not among its {what}s {sorted(declared)}")
    out_args = {declared_out[made]: path for made, path in outputs.items()}
    values: dict[str, Any] = {}  # argument -> its listing, keyed by argument
    for key, value in listings.items():
        dests = [d for d in ((key if key in inputs else None), declared_out.get(key) if key in outputs else None)
                 if d in listing_of]
        if len(dests) != 1:
            raise KeyError(f"stage {stage}: listing {key!r} is not of exactly one given input or output with a "
                           f"LISTINGS argument ({sorted(listing_of)})")
        values[dests[0]] = value
    sharing: dict[str, list[str]] = {}  # listing argument -> the arguments it lists
    for dest, shared in listing_of.items():
        sharing.setdefault(shared, []).append(dest)
    named: dict[str, Any] = {}

    def listing(dests: list[str]) -> None:
        for dest in dests:
            if dest in values and len(sharing[listing_of[dest]]) == 1 and values[dest] is not None:
                named[listing_of[dest]] = canonical_json(values[dest])

    for dest, paths in inputs.items():
        named[dest] = paths
        paired = [out for out in out_args if out == f"out_{dest}"]
        named.update({out: out_args[out] for out in paired})
        listing([dest, *paired])
    for dest, path in out_args.items():
        if dest not in named:
            named[dest] = path
            listing([dest])
    for shared, dests in sharing.items():
        if len(dests) > 1:
            merged: dict[str, Any] = {}
            for dest in dests:
                merged.update(values.get(dest) or {})  # in declaration order
            if merged:
                named[shared] = canonical_json(merged)
    return input_flags(named)


_WILDCARD = re.compile(r"\{(\w+)\}")


@functools.lru_cache(maxsize=None)
def template_regex(name: str) -> re.Pattern[str]:
    """A regular expression matching the paths of artifact ``name``, one named group per wildcard
    (a wildcard matches one path component, ``dim`` and ``budget`` digits only)."""
    template = artifact(name).template
    parts, last = [], 0
    for match in _WILDCARD.finditer(template):
        parts.append(re.escape(template[last:match.start()]))
        field = match[1]
        parts.append(rf"(?P<{field}>\d+)" if field in ("dim", "budget") else rf"(?P<{field}>[^/]+)")
        last = match.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts))
