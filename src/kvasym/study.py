"""The study's grid: a validated view of the config and the cells it spans.

The config (``config/config.yaml``, documented in ``config/README.md``) is checked in two steps,
both in :func:`load_study`: the JSON schema ``workflow/schemas/config.schema.yaml`` (types, ranges,
unknown keys, defaults: :func:`kvasym.config_schema.validate_config`), then what spans several keys
(schemes realisable at every budget, ranks within every dimension, unique names, the headline cell
in the grid). Either step names the offending key in a one-line :class:`KvasymError`.

A *cell* is (distribution, dim, scheme, budget); its data depend on (distribution, dim, trial)
only, so every scheme and budget sees the same keys, values and queries (a paired design).

Query-model variants (config key ``query_models``, :mod:`kvasym.querymodel`): each model of
``query_models.models`` applied to each low-rank distribution it names adds a distribution
``<name>+<model>`` (e.g. ``lowrank8+isotropic``, ``lowrank8+a2``) with the same kind, params
and dims (those of ``query_models.dims``; a calibrated alignment above the largest the rank
allows, d / r without noise, is left out at that d: d / r is the parent's own rule),
``query: <model>`` and ``keys_of: <name>``: its keys,
values and packed caches are its parent's, bit for bit (the DAG reads the parent's packed files,
so a variant costs one metrics job per dim and a stats job, no cells or theory job), and
only its queries differ. Variants are a factor of their parent's cells, not new distributions:
their per-trial rows are gathered (claims may name them), their comparisons and summary rows and
their theory checks are not (so no "every cell" claim, Holm family or table of the paper moves).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config_schema import defaults, load_schema, validate_config
from .distributions import DistributionSpec
from .errors import KvasymError
from .schemes import Scheme, scheme_registry

#: Defaults of the optional keys, as the schema states them (nested mappings filled key by key).
DEFAULTS: dict[str, Any] = defaults()
#: The config's top-level keys (``real`` is validated further by kvasym.real.real_settings).
TOP_KEYS = frozenset(load_schema()["properties"])
#: Budget of the headline cell when the config names none: this one if the grid has it, else the largest.
HEADLINE_BUDGET = 4


@dataclass(frozen=True)
class Study:
    base_seed: int
    norm_dtype: str
    dims: tuple[int, ...]
    budgets: tuple[int, ...]
    schemes: dict[str, Scheme]
    seq_len: int
    n_queries: int
    trials: int
    per_key_trials: int
    sharpness: tuple[float, ...]
    distributions: dict[str, DistributionSpec]
    distribution_dims: dict[str, tuple[int, ...]]
    stats: dict[str, int]
    theory: dict[str, int]
    claims_file: str
    #: Bring-your-own caches (distributions of kind ``file``, :mod:`kvasym.cachefile`), in
    #: config order: ``{name: {"name", "kind": "file", "params": {"path", "causal"}}}``. They
    #: have no generated data, theory or per-key tables; their dim is the file's head_dim.
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The one headline cell read by claims, tables and figures: ``{"distribution": str,
    #: "dim": int, "sharpness": float, "budget": int}``, from the config's ``headline`` (fields
    #: left out: :func:`headline_default`), always a cell of the grid.
    headline: dict[str, Any] = field(default_factory=dict)
    #: The rate-distortion frontier's own schemes (config key ``frontier.schemes``), run on
    #: :attr:`frontier_distributions` and the real rows, outside the grid's ``schemes``.
    frontier_schemes: dict[str, Scheme] = field(default_factory=dict)
    #: The synthetic distributions the frontier's schemes run on (every dim of each).
    frontier_distributions: tuple[str, ...] = ()
    #: Per frontier scheme, its own distributions when the config gives them
    #: (``frontier.distributions_of``); a scheme not listed runs on :attr:`frontier_distributions`.
    frontier_distributions_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: The frontier schemes that run on the real rows (``frontier.real_schemes``; default all).
    frontier_real_schemes: tuple[str, ...] = ()
    #: The query-aware variants (:data:`kvasym.real.queryaware.VARIANTS`) measured per head on the
    #: post-RoPE real rows beside the frontier's real schemes (``frontier.real_query_aware``),
    #: each text in bases cross-fitted on the other texts (stage ``real_metrics``).
    frontier_real_query_aware: tuple[str, ...] = ()
    #: Whether the cells stage writes the frontier schemes' packed caches too
    #: (``frontier.keep_packed``; default False: only the grid's, which the variants read).
    frontier_keep_packed: bool = False
    #: Budgets beyond :attr:`budgets` at which a scheme (of the grid or the frontier) runs on the
    #: frontier only (``frontier.extra_budgets``): ``{scheme: (n, ...)}``, budgets sorted; where,
    #: :meth:`extra_budgets_on`.
    frontier_extra_budgets: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def scheme(self, name: str) -> Scheme:
        """A scheme of the grid or of the frontier, or a built-in one (``real.e2e.extra_schemes``), by name."""
        if name in self.schemes:
            return self.schemes[name]
        if name in self.frontier_schemes:
            return self.frontier_schemes[name]
        from .schemes import BUILTIN_SCHEMES, get_scheme

        if name in BUILTIN_SCHEMES:
            return get_scheme(name)
        raise KvasymError(f"unknown scheme {name!r}")

    def scheme_definitions(self, real: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
        """Every scheme the DAG runs, once, with its one-line description (the paper's scheme
        table): the grid's, the frontier's, the end-to-end passes' (``real.e2e.schemes``, its
        extra schemes among them), then the query-aware variants the frontier or the end-to-end
        passes run (:data:`kvasym.real.queryaware.VARIANT_DESCRIPTIONS`)."""
        names = [*self.schemes, *self.frontier_schemes]
        e2e = (real or {}).get("e2e") or {}
        if isinstance(e2e.get("schemes"), list):
            names += [n for n in e2e["schemes"] if n not in names]
        out = [{"name": n, "description": self.scheme(n).description} for n in dict.fromkeys(names)]
        variants = [*self.frontier_real_query_aware, *e2e.get("query_aware", [])]
        if variants:
            from .real.queryaware import VARIANT_DESCRIPTIONS

            out += [{"name": v, "description": VARIANT_DESCRIPTIONS[v]} for v in dict.fromkeys(variants)]
        return out

    def frontier_schemes_on(self, distribution: str) -> list[str]:
        """The frontier's schemes that run on the synthetic ``distribution``, in config order."""
        return [s for s in self.frontier_schemes
                if distribution in self.frontier_distributions_of.get(s, self.frontier_distributions)]

    def frontier_shown_schemes(self, distribution: str) -> list[str]:
        """The schemes whose points the frontier shows on the synthetic ``distribution``: the
        grid's and the frontier's that run on it, or none where no frontier scheme runs."""
        own = self.frontier_schemes_on(distribution)
        return [*self.schemes, *own] if own else []

    def extra_budgets_on(self, distribution: str) -> dict[str, list[int]]:
        """``frontier.extra_budgets`` on the synthetic ``distribution``: ``{scheme: [n, ...]}`` for
        the schemes of :meth:`frontier_shown_schemes` that have extra budgets (a grid scheme on
        every frontier distribution, a frontier scheme on its own), in that order; ``{}``
        elsewhere (a distribution outside the frontier, a query-model variant)."""
        shown = self.frontier_shown_schemes(distribution)
        return {name: list(self.frontier_extra_budgets[name]) for name in shown if name in self.frontier_extra_budgets}

    def frontier_budgets(self, distribution: str, scheme: str) -> list[int]:
        """The budgets of ``scheme``'s frontier points on the synthetic ``distribution``: the grid's
        :attr:`budgets`, then its extra budgets there (:meth:`extra_budgets_on`)."""
        return [*self.budgets, *self.extra_budgets_on(distribution).get(scheme, [])]

    def real_extra_budgets(self) -> dict[str, list[int]]:
        """``frontier.extra_budgets`` on the real rows: ``{scheme: [n, ...]}`` for the schemes that
        run there (the grid's and ``frontier.real_schemes``) and have extra budgets; each cell is
        a ``real_metrics_extra`` job."""
        real = (*self.schemes, *self.frontier_real_schemes)
        return {name: list(b) for name, b in self.frontier_extra_budgets.items() if name in real}

    def frontier_cells(self) -> Iterator[tuple[str, int, str, int]]:
        """(distribution, dim, scheme, budget) of the synthetic cells the frontier adds to the grid's
        :meth:`cells`: its own schemes at every budget and every scheme's extra budgets."""
        for name, dim in self.data_cells():
            for scheme in self.frontier_shown_schemes(name):
                own = scheme not in self.schemes
                for budget in self.frontier_budgets(name, scheme):
                    if own or budget not in self.budgets:
                        yield name, dim, scheme, budget

    def frontier_data_cells(self) -> list[tuple[str, int]]:
        """(distribution, dim) pairs of the frontier (synthetic: those at least one frontier
        scheme runs on), in config order."""
        return [(name, dim) for name, dim in self.data_cells() if self.frontier_schemes_on(name)]

    def seq_len_sweep_slice(self) -> dict[str, Any]:
        """What the seq_len_sweep job depends on: the resolved sweep, its distribution's spec,
        its schemes' specs, the seeds and norm storage, and the bootstrap's replicates."""
        sweep = self.seq_len_sweep
        if not sweep:
            raise KvasymError("config key seq_len_sweep.seq_lens is empty: no sweep")
        schemes = []
        for name in sweep["schemes"]:
            spec = self.scheme(name).spec_dict()
            spec.pop("description", None)
            schemes.append({"name": name, "spec": spec})
        return {**{k: v for k, v in sweep.items() if k != "schemes"}, "schemes": schemes,
                "distribution": self.distributions[sweep["distribution"]].to_dict(), "base_seed": self.base_seed,
                "norm_dtype": self.norm_dtype, "n_boot": int(self.stats["n_boot"])}

    def frontier_slice(self) -> dict[str, Any]:
        """What the frontier stage depends on besides its per-query inputs: the schemes, the grid's
        budgets and, when the config gives any, ``extra_budgets`` (``frontier.extra_budgets``: left
        out when empty, so that a config without it keeps the slice it had before the key)."""
        out: dict[str, Any] = {"schemes": [*self.schemes, *self.frontier_schemes, *self.frontier_real_query_aware],
                               "frontier_schemes": list(self.frontier_schemes), "budgets": list(self.budgets)}
        if self.frontier_extra_budgets:
            out["extra_budgets"] = {name: list(b) for name, b in self.frontier_extra_budgets.items()}
        return out
    #: The sequence-length sweep (config key ``seq_len_sweep``, :mod:`kvasym.seqlen`), resolved:
    #: ``{seq_lens, distribution, dim, sharpness, schemes, budgets, trials, n_queries}``; empty
    #: when not configured.
    seq_len_sweep: dict[str, Any] = field(default_factory=dict)
    #: Query-model variants (config key ``query_models``): ``{name: {"of": parent, "query": model}}``,
    #: in config order; each is also in :attr:`distributions` (its spec has ``keys_of`` = parent).
    query_variants: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The config's ``query_models`` settings (schema defaults filled in) that made them.
    query_models: dict[str, Any] = field(default_factory=dict)

    def packed_distribution(self, distribution: str) -> str:
        """The distribution whose packed caches a cell of ``distribution`` reads: its parent for a
        query-model variant (same keys, same seeds), itself otherwise."""
        variant = self.query_variants.get(distribution)
        return variant["of"] if variant else distribution

    def main_data_cells(self) -> Iterator[tuple[str, int]]:
        """(distribution, dim) pairs without the query-model variants: those with theory checks and
        gathered comparisons and summary rows."""
        for name, dim in self.data_cells():
            if name not in self.query_variants:
                yield name, dim

    def file_slice(self, distribution: str, dim: int, scheme: str, budget: int) -> dict[str, Any]:
        """Everything a file cell's metrics job depends on besides the file itself."""
        if distribution not in self.files:
            raise KvasymError(f"unknown file distribution {distribution!r}")
        if scheme not in self.schemes:
            raise KvasymError(f"unknown scheme {scheme!r}")
        spec = self.schemes[scheme].spec_dict()
        spec.pop("description", None)
        return {
            "distribution": self.files[distribution],
            "dim": int(dim),
            "scheme": {"name": scheme, **spec},
            "budget": int(budget),
            "sharpness": list(self.sharpness),
            "n_queries": self.n_queries,
            "base_seed": self.base_seed,
            "norm_dtype": self.norm_dtype,
        }

    def data_cells(self) -> Iterator[tuple[str, int]]:
        """(distribution, dim) pairs, in config order."""
        for name in self.distributions:
            for dim in self.distribution_dims[name]:
                yield name, dim

    def cells(self) -> Iterator[tuple[str, int, str, int]]:
        """(distribution, dim, scheme, budget) for every cell of the grid."""
        for name, dim in self.data_cells():
            for scheme in self.schemes:
                for budget in self.budgets:
                    yield name, dim, scheme, budget

    def data_slice(self, distribution: str, dim: int) -> dict[str, Any]:
        """Everything the data of (distribution, dim) depends on: a canonical JSON-able dict."""
        if distribution not in self.distributions:
            raise KvasymError(f"unknown distribution {distribution!r}")
        return {
            "distribution": self.distributions[distribution].to_dict(),
            "dim": int(dim),
            "seq_len": self.seq_len,
            "n_queries": self.n_queries,
            "trials": self.trials,
            "base_seed": self.base_seed,
        }

    def cell_slice(self, distribution: str, dim: int, scheme: str, budget: int) -> dict[str, Any]:
        """Everything a cell's packed caches depend on (the data slice, the scheme's spec, budget)."""
        out = self.data_slice(distribution, dim)
        spec = self.scheme(scheme).spec_dict()
        spec.pop("description", None)  # prose: changing it must not rerun anything
        out.update(
            scheme={"name": scheme, **spec},
            budget=int(budget),
            norm_dtype=self.norm_dtype,
        )
        return out

    def stats_slice(self, distribution: str, dim: int) -> dict[str, Any]:
        """What the stats job of (distribution, dim) depends on (beyond its metrics inputs)."""
        return {
            "distribution": distribution,
            "dim": int(dim),
            "schemes": list(self.schemes),
            # the specs too: the KL ratio's second-order prediction depends on the key sides
            "scheme_specs": {name: scheme.spec_dict() for name, scheme in self.schemes.items()},
            "base_seed": self.base_seed,
            "stats": dict(self.stats),
        }

    def theory_slice(self, distribution: str, dim: int) -> dict[str, Any]:
        """What the theory job of (distribution, dim) depends on (data slice, budgets, settings)."""
        out = self.data_slice(distribution, dim)
        out.update(budgets=list(self.budgets), theory=dict(self.theory))
        return out

    def unit_schemes(self, distribution: str) -> list[str]:
        """The schemes of a (distribution, dim) unit: the grid's, then the frontier's that run on
        ``distribution`` (none on a query-model variant, whose cells are the grid's)."""
        return [*self.schemes, *self.frontier_schemes_on(distribution)]

    def packed_schemes(self, distribution: str) -> list[str]:
        """The schemes of a unit whose packed caches its job writes: the grid's (the query-model
        variants read them), and the frontier's only with ``frontier.keep_packed``."""
        return self.unit_schemes(distribution) if self.frontier_keep_packed else list(self.schemes)

    def unit_slice(self, distribution: str, dim: int) -> dict[str, Any]:
        """What the one job of a (distribution, dim) unit depends on (rule ``cells``, or
        ``metrics`` for a query-model variant): the data slice, every scheme's spec in
        :meth:`unit_schemes` order, the budgets and the metric settings, and the schemes whose
        packed caches are written (:meth:`packed_schemes`). Its cells' slices
        (:func:`kvasym.stages.metrics.unit_cells`) are :meth:`metrics_slice`.

        A unit of the frontier with extra budgets (:meth:`extra_budgets_on`) also has
        ``extra_budgets`` (``{scheme: [n, ...]}``) and ``packed_extra`` (``frontier.keep_packed``:
        whether those cells' packed caches are written); the other units' slices have neither key,
        so giving ``frontier.extra_budgets`` reruns only the units it adds cells to."""
        out = self.data_slice(distribution, dim)
        schemes = []
        for name in self.unit_schemes(distribution):
            spec = self.scheme(name).spec_dict()
            spec.pop("description", None)  # prose: changing it must not rerun anything
            schemes.append({"name": name, **spec})
        out.update(schemes=schemes, budgets=list(self.budgets), norm_dtype=self.norm_dtype,
                   sharpness=list(self.sharpness), per_key_trials=self.per_key_trials,
                   packed_schemes=self.packed_schemes(distribution))
        extra = self.extra_budgets_on(distribution)
        if extra:
            out.update(extra_budgets=extra, packed_extra=self.frontier_keep_packed)
        return out

    def metrics_slice(self, distribution: str, dim: int, scheme: str, budget: int) -> dict[str, Any]:
        """A quantize slice plus what only the metrics depend on."""
        out = self.cell_slice(distribution, dim, scheme, budget)
        out.update(sharpness=list(self.sharpness), per_key_trials=self.per_key_trials)
        return out

    def rank_references(self) -> list[str]:
        """The heavy-tailed references of the low-rank data: at each dim with low-rank data (in
        increasing order), the Student-t distribution with the smallest nu there, each named
        once. They are the rank sweep's reference lines and the query-model table's
        denominators (:meth:`query_model_slice`), C5's heavy-tailed keys."""
        specs = [{**self.distributions[name].to_dict(), "dims": list(self.distribution_dims[name])}
                 for name in self.distributions if name not in self.query_variants]
        references: list[str] = []
        for d in sorted({d for spec in specs if spec["kind"] == "low_rank" for d in spec["dims"]}):
            heaviest = extreme_first([spec for spec in specs if d in spec["dims"]], "student_t")[:1]
            references += [name for name in heaviest if name not in references]
        return references

    def query_model_slice(self) -> dict[str, Any]:
        """What the query-model table depends on besides the gathered trials (stage ``gather``,
        :func:`kvasym.claims.query_model_points`, whose keyword arguments these are): the
        low-rank distributions' ranks and noise, the query-model variants, the references
        (:meth:`rank_references`), C5's scheme (KQV, else the first scheme), the headline budget
        and sharpness, and the claims' bootstrap settings."""
        parents = {name: {"rank": int(spec.params["rank"]), "noise": float(spec.params.get("noise", 0.0))}
                   for name, spec in self.distributions.items()
                   if spec.kind == "low_rank" and name not in self.query_variants}
        return {
            "parents": parents,
            "variants": {name: dict(variant) for name, variant in self.query_variants.items()},
            "references": self.rank_references(),
            "scheme": "KQV" if "KQV" in self.schemes else next(iter(self.schemes)),
            "budget": int(self.headline["budget"]),
            "sharpness": float(self.headline["sharpness"]),
            "n_boot": int(self.stats["n_boot"]),
            "base_seed": int(self.base_seed),
        }


    def real_slice(self, distribution: str, scheme: str, layers: list[int]) -> dict[str, Any]:
        """What one real metrics job (stage ``real_metrics``: a real distribution and scheme, every
        budget) depends on besides its captures: the scheme's spec, the budgets, the model's own
        sharpness, the seeds, the norm storage and the captured ``layers`` (``real.layers``)."""
        from .real import REAL_SHARPNESS

        if scheme in self.frontier_real_query_aware:
            from .real.queryaware import variant_scheme

            spec = variant_scheme(scheme).spec_dict()
            spec.pop("description", None)
            extra = {"query_aware": {"variant": scheme, "calibration": "leave-one-text-out"}}
        else:
            spec, extra = self.scheme(scheme).spec_dict(), {}
        return {
            "distribution": distribution,
            "scheme": {"name": scheme, **spec},
            "budgets": list(self.budgets),
            "sharpness": [REAL_SHARPNESS],  # the model's own attention
            "base_seed": self.base_seed,
            "norm_dtype": self.norm_dtype,
            "layers": list(layers),
            **extra,
        }

    def e2e_slice(self, text: str, real: Mapping[str, Any]) -> dict[str, Any]:
        """What the end-to-end job of one shipped ``text`` (stage ``e2e``) depends on: ``real`` is
        the config's resolved ``real`` section (:func:`kvasym.real.real_settings`), its ``e2e``
        settings on."""
        e2e = real["e2e"]
        return {
            "text": text,
            "max_tokens": real["max_tokens"],
            "schemes": [{"name": name, **self.scheme(name).spec_dict()} for name in e2e["schemes"]],
            "budgets": list(self.budgets),
            "base_seed": self.base_seed,
            "norm_dtype": self.norm_dtype,
            "e2e": {key: e2e[key] for key in ("draws", "rope", "extra_budgets", "own", "sensitivity_layers",
                                              "sensitivity_schemes", "query_aware", "recent_windows",
                                              "causal_chunks")}
                   # only when set, so that a slice without them is what it was before the key existed
                   | ({"global_only": list(e2e["global_only"])} if e2e.get("global_only") else {}),
            **_model_key(real),
        }

    def e2e_part_slice(self, text: str, part: int, real: Mapping[str, Any]) -> dict[str, Any]:
        """What one job of rule ``e2e`` depends on: :meth:`e2e_slice`, and with ``real.e2e.parts``
        ``P > 1`` its share ``"part": [part, P]`` of the text's passes (without it, the one job's
        slice is the text's, as before parts existed)."""
        parts = int(real["e2e"].get("parts", 1))
        if not 0 <= int(part) < parts:
            raise KvasymError(f"e2e part {part} of text {text}: real.e2e.parts is {parts} (parts 0..{parts - 1})")
        from .real.jobparts import part_slice

        return part_slice(self.e2e_slice(text, real), (int(part), parts))

    def calibrate_slice(self, real: Mapping[str, Any]) -> dict[str, Any]:
        """What the query-aware calibration (stage ``calibrate``) depends on: its texts (shipped
        texts disjoint from the end-to-end texts) and the tokens kept per text."""
        e2e = real["e2e"]
        return {"texts": list(e2e["calibration_texts"]), "evaluation_texts": list(e2e["texts"]),
                "max_tokens": real["max_tokens"], **_model_key(real)}

    def _model_pass_slice(self, section: Mapping[str, Any], real: Mapping[str, Any]) -> dict[str, Any]:
        """The schemes (as dicts; query-aware variants by name) and settings of a long-context or
        passkey job."""
        variants = set(real["e2e"]["query_aware"])
        return {
            "schemes": [{"name": name, **self.scheme(name).spec_dict()} for name in section["schemes"]
                        if name not in variants],
            "query_variants": [name for name in section["schemes"] if name in variants],
            "budgets": list(section["budgets"]),
            "base_seed": self.base_seed,
            "norm_dtype": self.norm_dtype,
        }

    def e2e_long_slice(self, length: int, real: Mapping[str, Any], part: int = 0) -> dict[str, Any]:
        """What one job of the long-context windows of one length (stage ``e2e_long``) depends on:
        with ``long_context.parts`` ``P > 1``, its share ``"part": [part, P]`` of the windows
        (:func:`kvasym.real.jobparts.part_slice`)."""
        from .real.jobparts import part_slice

        section = real["e2e"]["long_context"]
        whole = {"length": int(length), "windows": int(section["windows"]),
                 "calibration_windows": int(section["calibration_windows"]), "own": real["e2e"]["own"],
                 **self._model_pass_slice(section, real), **_model_key(real)}
        return part_slice(whole, self._part(part, section, "long_context", _where(real, "e2e.long_context")))

    def passkey_slice(self, length: int, real: Mapping[str, Any], part: int = 0) -> dict[str, Any]:
        """What one job of the passkey trials of one length (stage ``passkey``) depends on: with
        ``passkey.parts`` ``P > 1``, its share ``"part": [part, P]`` of the trials
        (:func:`kvasym.real.jobparts.part_slice`)."""
        from .real.jobparts import part_slice

        section = real["e2e"]["passkey"]
        whole = {"length": int(length), "depths": list(section["depths"]), "trials": int(section["trials"]),
                 **self._model_pass_slice(section, real), **_model_key(real)}
        return part_slice(whole, self._part(part, section, "passkey", _where(real, "e2e.passkey")))

    def greedy_slice(self, real: Mapping[str, Any]) -> dict[str, Any]:
        """What one model's greedy-agreement job (stage ``greedy``) depends on: the section's
        texts, prompt sizes, schemes (as dicts), budgets and causal chunks.

        Raises
        ------
        KvasymError
            When a scheme that keeps statistics over blocks of rows has no causal chunk (its
            teacher-forced pass would not be what greedy decoding stores), naming the key.
        """
        from .real.endtoend import uses_block_statistics

        where = _where(real, "e2e.greedy")
        section = real["e2e"]["greedy"]
        if section is None:
            raise KvasymError(f"stage greedy: config key {where} is off")
        chunks = dict(section["causal_chunks"])
        for name in section["schemes"]:
            if uses_block_statistics(self.scheme(name)) and name not in chunks:
                raise KvasymError(f"config key {where}.schemes: {name} keeps statistics over blocks of rows; give it "
                                  f"a chunk in {where}.causal_chunks (a streaming engine's storage)")
        return {"texts": list(section["texts"]), "prompt_tokens": int(section["prompt_tokens"]),
                "prompts_per_text": int(section["prompts_per_text"]), "new_tokens": int(section["new_tokens"]),
                "schemes": [{"name": name, **self.scheme(name).spec_dict()} for name in section["schemes"]],
                "budgets": list(section["budgets"]), "causal_chunks": chunks, "base_seed": self.base_seed,
                "norm_dtype": self.norm_dtype, **_model_key(real)}

    @staticmethod
    def _part(part: int, section: Mapping[str, Any], key: str, where: str = "") -> tuple[int, int]:
        """``(part, P)`` with ``P`` the section's ``parts`` (config key ``where or real.e2e.<key>``)."""
        parts = int(section.get("parts", 1))
        if not 0 <= int(part) < parts:
            raise KvasymError(f"{key} part {part}: {where or 'real.e2e.' + key}.parts is {parts} "
                              f"(parts 0..{parts - 1})")
        return int(part), parts

    def sensitivity_slice(self, text: str, real: Mapping[str, Any], part: int = 0) -> dict[str, Any]:
        """What one job of the card's calibration on one text (stage ``sensitivity``) depends on:
        with ``real.card.parts`` ``P > 1``, its share ``"part": [part, P]`` of the text's rows
        (:func:`kvasym.real.jobparts.part_slice`)."""
        from .real.jobparts import part_slice

        card = real["card"]
        whole = {"text": text, "evaluation_texts": list(real["e2e"]["texts"]), "max_tokens": real["max_tokens"],
                 "scheme": {"name": card["scheme"], **self.scheme(card["scheme"]).spec_dict()},
                 "widths": list(card["widths"]), "granularity": card["granularity"], "base_seed": self.base_seed,
                 "norm_dtype": self.norm_dtype, **_model_key(real)}
        return part_slice(whole, self._part(part, card, "card", _where(real, "card")))

    def card_slice(self, real: Mapping[str, Any]) -> dict[str, Any]:
        """What the model card (stage ``card``) depends on besides its tables: the end-to-end texts
        and draws it evaluates the allocation on."""
        card = real["card"]
        return {"texts": list(real["e2e"]["texts"]), "calibration_texts": list(card["calibration_texts"]),
                "max_tokens": real["max_tokens"],
                "scheme": {"name": card["scheme"], **self.scheme(card["scheme"]).spec_dict()},
                "budgets": list(card["budgets"]), "widths": list(card["widths"]), "granularity": card["granularity"],
                "draws": int(real["e2e"]["draws"]), "base_seed": self.base_seed, "norm_dtype": self.norm_dtype,
                **_model_key(real)}

    def e2e_stats_slice(self, real: Mapping[str, Any]) -> dict[str, Any]:
        """What the end-to-end statistics job (stage ``e2e_stats``) depends on besides its tables:
        ``schemes`` are every scheme name of the passes in order (the e2e schemes, the
        query-aware variants, ``<scheme>+R<window>`` and ``<scheme>+C<chunk>``)."""
        out = {**self._e2e_stats_schemes(real["e2e"]), "budgets": list(self.budgets), "base_seed": self.base_seed,
               "n_boot": self.stats["n_boot"]}
        if real.get("models"):  # further models' passes: their own scheme lists (absent otherwise, so that
            # a config without them keeps its slice)
            out["models"] = {key: self._e2e_stats_schemes(section["e2e"]) for key, section in real["models"].items()}
        return out

    def _e2e_stats_schemes(self, e2e: Mapping[str, Any]) -> dict[str, list[str]]:
        """Every scheme name of one model's passes in order, and the study's among them."""
        schemes = [*e2e["schemes"], *e2e["query_aware"],
                   *(f"{name}+R{r}" for name, sizes in e2e["recent_windows"].items() for r in sizes),
                   *(f"{name}+C{c}" for name, c in e2e["causal_chunks"].items()),
                   *(f"{name}+G" for name in e2e.get("global_only", ()))]
        return {"schemes": schemes, "study_schemes": [name for name in self.schemes if name in e2e["schemes"]]}

    def file_cell_slice(self, distribution: str, dim: int, scheme: str, budget: int,
                        content_sha256: str) -> dict[str, Any]:
        """A file cell's metrics job's slice (stage ``file_metrics``): :meth:`file_slice` and the
        content digest of the user's file, so that replacing the file by another that keeps its
        mtime still reruns its cells."""
        return {**self.file_slice(distribution, int(dim), scheme, int(budget)), "content_sha256": content_sha256}

    def cell_table_slice(self, distribution: str, dim: int, scheme: str, budget: int, *,
                         real: Mapping[str, Any] | None = None,
                         file_digests: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The slice a cell's per-query (and per-key) file is made from, as its provenance records
        it: a file cell's :meth:`file_cell_slice`, a synthetic or variant cell's
        :meth:`metrics_slice`, and any other distribution's (a real one's) :meth:`real_slice` with
        its one ``budget`` in place of ``budgets``.

        Parameters
        ----------
        distribution, dim, scheme, budget
            The cell (``dim`` and ``budget`` as ints or their strings, as wildcards give them).
        real : mapping, optional
            The resolved ``real`` section (:func:`kvasym.real.real_settings`), for a real cell.
        file_digests : mapping, optional
            File distribution -> the content SHA-256 of its cache file, for a file cell.
        """
        if distribution in self.files:
            if file_digests is None:
                raise KvasymError(f"file distribution {distribution!r}: no content digest given")
            return self.file_cell_slice(distribution, dim, scheme, budget, file_digests[distribution])
        if distribution in self.distributions:
            return self.metrics_slice(distribution, int(dim), scheme, int(budget))
        if real is None:
            raise KvasymError(f"unknown distribution {distribution!r} (no real-model rows configured)")
        cell = self.real_slice(distribution, scheme, real["layers"])
        cell.pop("budgets")
        return {**cell, "budget": int(budget)}

    def job_slice(self, stage: str, wildcards: Mapping[str, Any], *, real: Mapping[str, Any] | None = None,
                  file_digests: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The ``--slice`` of a job of a grid stage (:data:`kvasym.stages._slice.SLICE_KEYS`) from
        its wildcards: the narrow config slice it depends on, a Snakemake param (its JSON,
        :func:`canonical_json`, reruns the job when it changes) and the base of its resources
        (:func:`kvasym.resources.job_resources`).

        Parameters
        ----------
        stage : str
            ``cells``, ``metrics``, ``stats``, ``theory``, ``file_metrics``, ``real_metrics``,
            ``real_metrics_extra`` (a real cell at one of its scheme's ``frontier.extra_budgets``:
            the ``real_metrics`` slice with that one budget), ``e2e``, ``calibrate``,
            ``e2e_long``, ``passkey``, ``sensitivity``, ``card``, ``greedy`` or ``e2e_stats``.
        wildcards : mapping
            The job's wildcards (``distribution``, ``dim``, ``scheme``, ``budget``, ``text``, as
            the stage's rule has them; strings or ints).
        real, file_digests
            As for :meth:`cell_table_slice`: the real-model settings (for ``real_metrics``,
            ``e2e``, ``e2e_stats``) and the file caches' content digests (for ``file_metrics``).
        """
        w = wildcards
        if stage in ("cells", "metrics"):
            return self.unit_slice(w["distribution"], int(w["dim"]))
        if stage == "stats":
            return self.stats_slice(w["distribution"], int(w["dim"]))
        if stage == "theory":
            return self.theory_slice(w["distribution"], int(w["dim"]))
        if stage == "file_metrics":
            return self.cell_table_slice(w["distribution"], w["dim"], w["scheme"], w["budget"],
                                         file_digests=file_digests)
        if stage not in ("real_metrics", "real_metrics_extra", "e2e", "e2e_join", "e2e_stats", "calibrate", "e2e_long",
                         "passkey", "sensitivity", "card", "greedy"):
            raise KvasymError(f"stage {stage!r} takes no grid slice")
        if real is None:
            raise KvasymError(f"stage {stage}: no real-model rows configured (config key real)")
        if stage == "real_metrics":
            return self.real_slice(w["distribution"], w["scheme"], real["layers"])
        if stage == "real_metrics_extra":  # one cell at an extra budget of its scheme (frontier.extra_budgets)
            budget = int(w["budget"])
            if budget not in self.real_extra_budgets().get(w["scheme"], ()):
                raise KvasymError(f"real cell {w['scheme']} n = {budget}: not an extra budget of {w['scheme']} "
                                  "(config key frontier.extra_budgets)")
            return {**self.real_slice(w["distribution"], w["scheme"], real["layers"]), "budgets": [budget]}
        if stage in ("e2e", "e2e_join", "calibrate", "e2e_long", "passkey", "sensitivity", "card",
                     "greedy") and "model" in w:
            from .real import model_section

            real = model_section(real, str(w["model"]))
        if stage == "e2e_join":
            return self.e2e_slice(w["text"], real)
        if stage == "e2e":
            return self.e2e_part_slice(w["text"], int(w["part"]), real)
        if stage == "calibrate":
            return self.calibrate_slice(real)
        if stage == "e2e_long":
            return self.e2e_long_slice(int(w["length"]), real, int(w["part"]))
        if stage == "passkey":
            return self.passkey_slice(int(w["length"]), real, int(w["part"]))
        if stage == "sensitivity":
            return self.sensitivity_slice(str(w["text"]), real, int(w["part"]))
        if stage == "card":
            return self.card_slice(real)
        if stage == "greedy":
            return self.greedy_slice(real)
        return self.e2e_stats_slice(real)


def _where(real: Mapping[str, Any], key: str) -> str:
    """The config key ``real.<key>`` of the model whose section ``real`` is
    (``real.models.<model>.<key>`` for a further model)."""
    return f"real.models.{real['model']}.{key}" if real.get("model") else f"real.{key}"


def _model_key(real: Mapping[str, Any]) -> dict[str, str]:
    """``{"model": key}`` for a further model's section (:func:`kvasym.real.model_section`), else
    nothing: the primary model's slices are what they were before further models existed."""
    return {"model": str(real["model"])} if real.get("model") else {}


def extreme_first(specs: list[Mapping[str, Any]], kind: str) -> list[str]:
    """The names of the instances of ``kind`` among ``specs`` (``{name, kind, params}``), from
    the most extreme to the least: smallest nu for ``student_t``, smallest rank for ``low_rank``,
    most outlier energy for ``concentrated``; other kinds in the order given."""
    items = [s for s in specs if s["kind"] == kind]
    if kind == "student_t":
        items.sort(key=lambda s: float(s["params"]["nu"]))
    elif kind == "low_rank":
        items.sort(key=lambda s: int(s["params"]["rank"]))
    elif kind == "concentrated":
        items.sort(key=lambda s: -float(s["params"]["outlier_scale"]) ** 2 * int(s["params"]["n_outliers"]))
    return [s["name"] for s in items]


def load_study_file(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> Study:
    """Read a YAML config (plus ``overrides``, as ``snakemake --config`` would) into a Study."""
    from .config_io import read_yaml_mapping

    config = read_yaml_mapping(path)
    config.update(overrides or {})
    try:
        return load_study(config)
    except KvasymError as exc:
        raise KvasymError(f"{path}: {exc}") from None


def canonical_json(data: Mapping[str, Any]) -> str:
    """Sorted, compact JSON: a stable string for Snakemake params (its rerun trigger)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def load_study(config: Mapping[str, Any]) -> Study:
    """Validate a config mapping into a :class:`Study`: first the schema (types, ranges, unknown
    keys, defaults: :func:`kvasym.config_schema.validate_config`), then what spans several keys.

    The checks kept here: schemes known (built-in or ``user_schemes``, which may not redefine a
    built-in) and realisable at every budget; scheme and distribution names unique and not equal
    but for case; a ``file`` distribution without ``dims`` and with a cache file suffix; ranks and
    outlier counts within every dim of their distribution; at least one synthetic distribution;
    ``per_key_trials`` <= ``trials``; one trial's matrices within :data:`MAX_TRIAL_ENTRIES`; the
    ``headline`` cell in the grid. ``real`` is checked by :func:`kvasym.real.real_settings`.
    """
    cfg = validate_config(config)
    budgets: tuple[int, ...] = tuple(cfg["budgets"])
    registry = scheme_registry(cfg["user_schemes"])
    names: list[str] = cfg["schemes"]
    _no_case_clash(names, "schemes")
    schemes: dict[str, Scheme] = {}
    for i, name in enumerate(names):
        if name not in registry:
            known = ", ".join(sorted(registry))
            raise KvasymError(f"config key schemes[{i}] = {name!r} is not a known scheme; known: {known}")
        for budget in budgets:
            registry[name].validate_budget(budget)
        schemes[name] = registry[name]

    dims: tuple[int, ...] = tuple(cfg["dims"])
    distributions: dict[str, DistributionSpec] = {}
    distribution_dims: dict[str, tuple[int, ...]] = {}
    files: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(cfg["distributions"]):
        where = f"distributions[{i}]"
        name = entry["name"]
        if name in distributions or name in files:
            raise KvasymError(f"{where}: duplicated distribution name {name!r}")
        _no_case_clash([*distributions, *files, name], "distributions[].name")
        if entry["kind"] == FILE_KIND:
            files[name] = _file_distribution(entry)
            continue
        spec = DistributionSpec.from_dict({k: v for k, v in entry.items() if k != "dims"})
        own_dims = tuple(entry.get("dims", dims))
        for dim in own_dims:
            for key in ("rank", "n_outliers"):
                if key in spec.params and spec.params[key] > dim:
                    raise KvasymError(f"distributions[{spec.name}].{key} = {spec.params[key]} exceeds dim = {dim}")
        distributions[spec.name] = spec
        distribution_dims[spec.name] = own_dims
    if not distributions:
        raise KvasymError(
            "config key distributions has no synthetic distribution (gaussian, student_t, low_rank, "
            "concentrated): the study's headline and theory checks need one; file caches are evaluated beside it"
        )

    frontier_schemes, frontier_distributions, frontier_distributions_of = _frontier(
        cfg["frontier"], registry, schemes, budgets, distributions)
    # after the frontier's distributions are chosen: the query-model variants read their parents'
    # caches and have no frontier cells of their own
    query_variants = _query_variants(cfg["query_models"], distributions, distribution_dims, files)
    _check_sketch_dims({**schemes, **frontier_schemes}, distribution_dims)
    trials, per_key_trials = cfg["trials"], cfg["per_key_trials"]
    if per_key_trials > trials:
        raise KvasymError(f"config key per_key_trials: must be in 0..trials = 0..{trials}, got {per_key_trials}")
    _check_trial_size(cfg["seq_len"], cfg["n_queries"], max(max(d) for d in distribution_dims.values()),
                      trials, tuple(cfg["sharpness"]))
    sharpness = tuple(float(s) for s in cfg["sharpness"])
    headline = _headline(cfg.get("headline", {}), {n: d for n, d in distribution_dims.items()
                                                    if n not in query_variants}, sharpness, budgets, files)
    seq_len_sweep = _seq_len_sweep(cfg.get("seq_len_sweep", {}), schemes, budgets, distributions, distribution_dims,
                                   headline)
    return Study(
        base_seed=cfg["base_seed"],
        norm_dtype=cfg["norm_dtype"],
        dims=dims,
        budgets=budgets,
        schemes=schemes,
        seq_len=cfg["seq_len"],
        n_queries=cfg["n_queries"],
        trials=trials,
        per_key_trials=per_key_trials,
        sharpness=sharpness,
        distributions=distributions,
        distribution_dims=distribution_dims,
        stats=dict(cfg["stats"]),
        theory=dict(cfg["theory"]),
        claims_file=cfg["claims_file"],
        files=files,
        headline=headline,
        query_variants=query_variants,
        query_models=dict(cfg["query_models"]),
        seq_len_sweep=seq_len_sweep,
        frontier_schemes=frontier_schemes,
        frontier_distributions=frontier_distributions,
        frontier_distributions_of=frontier_distributions_of,
        frontier_real_schemes=_frontier_real(cfg["frontier"], frontier_schemes),
        frontier_real_query_aware=_frontier_real_query_aware(cfg["frontier"], [*schemes, *frontier_schemes]),
        frontier_keep_packed=bool(cfg["frontier"].get("keep_packed", False)),
        frontier_extra_budgets=_frontier_extra_budgets(cfg["frontier"], {**schemes, **frontier_schemes}, budgets),
    )


def _frontier(cfg: Mapping[str, Any], registry: Mapping[str, Scheme], schemes: Mapping[str, Scheme],
              budgets: tuple[int, ...], distributions: Mapping[str, Any],
              ) -> tuple[dict[str, Scheme], tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The frontier's schemes and distributions (config key ``frontier``), checked: known,
    realisable at every budget, not already in ``schemes``, distributions synthetic ones; and
    each scheme's own distributions (``frontier.distributions_of``), checked the same way."""
    out: dict[str, Scheme] = {}
    names = list(cfg.get("schemes", []))
    _no_case_clash([*schemes, *names], "schemes and frontier.schemes")
    for i, name in enumerate(names):
        if name not in registry:
            raise KvasymError(f"config key frontier.schemes[{i}] = {name!r} is not a known scheme; known: "
                              f"{', '.join(sorted(registry))}")
        if name in schemes:
            raise KvasymError(f"config key frontier.schemes[{i}] = {name!r} is already in schemes (a frontier "
                              "scheme runs beside the grid's, not twice)")
        for budget in budgets:
            registry[name].validate_budget(budget)
        out[name] = registry[name]
    own: dict[str, tuple[str, ...]] = {}
    for scheme, listed in (cfg.get("distributions_of") or {}).items():
        if scheme not in out:
            raise KvasymError(f"config key frontier.distributions_of.{scheme}: {scheme!r} is not one of "
                              f"frontier.schemes ({', '.join(out) or 'none'})")
        own[scheme] = _frontier_distributions(listed, distributions, f"frontier.distributions_of.{scheme}")
    chosen = cfg.get("distributions")
    if chosen is None:
        return out, tuple(distributions), own
    return out, _frontier_distributions(chosen, distributions, "frontier.distributions"), own


def _seq_len_sweep(cfg: Mapping[str, Any], schemes: Mapping[str, Scheme], budgets: tuple[int, ...],
                   distributions: Mapping[str, Any], distribution_dims: Mapping[str, tuple[int, ...]],
                   headline: Mapping[str, Any]) -> dict[str, Any]:
    """The sequence-length sweep resolved (config key ``seq_len_sweep``; defaults: the headline's
    distribution, dim and sharpness, every scheme and budget), or {} without lengths."""
    lengths = [int(x) for x in cfg.get("seq_lens", [])]
    if not lengths:
        return {}
    name = cfg.get("distribution", headline["distribution"])
    if name not in distributions:
        raise KvasymError(f"config key seq_len_sweep.distribution = {name!r} is not a synthetic distribution of the "
                          f"grid; known: {', '.join(distributions)}")
    spec = distributions[name]
    if spec.keys_of is not None:
        raise KvasymError(f"config key seq_len_sweep.distribution = {name!r} is a query-model variant; name its parent")
    own_dims = distribution_dims[name]
    dim = int(cfg.get("dim", headline.get("dim", own_dims[0]) if headline.get("distribution", name) == name
                      else own_dims[0]))
    for key in ("rank", "n_outliers"):
        if key in spec.params and int(spec.params[key]) > dim:
            raise KvasymError(f"config key seq_len_sweep.dim = {dim}: distributions[{name}].{key} exceeds it")
    chosen = list(cfg.get("schemes", list(schemes)))
    for i, scheme in enumerate(chosen):
        if scheme not in schemes:
            raise KvasymError(f"config key seq_len_sweep.schemes[{i}] = {scheme!r} is not one of schemes "
                              f"({', '.join(schemes)})")
    chosen_budgets = [int(b) for b in cfg.get("budgets", list(budgets))]
    for i, budget in enumerate(chosen_budgets):
        for scheme in chosen:
            try:
                schemes[scheme].validate_budget(budget)
            except KvasymError as exc:
                raise KvasymError(f"config key seq_len_sweep.budgets[{i}]: {exc}") from None
    n_queries, trials = int(cfg.get("n_queries", 64)), int(cfg.get("trials", 8))
    for length in lengths:
        if length * max(n_queries, dim) > 2**31:
            raise KvasymError(f"config key seq_len_sweep.seq_lens: {length} keys x {max(n_queries, dim)} pass 2^31 "
                              "entries per matrix")
    return {"seq_lens": sorted(lengths), "distribution": name, "dim": dim,
            "sharpness": float(cfg.get("sharpness", headline["sharpness"])),
            "schemes": chosen, "budgets": sorted(chosen_budgets), "trials": trials, "n_queries": n_queries}


def _frontier_extra_budgets(cfg: Mapping[str, Any], schemes: Mapping[str, Scheme], budgets: tuple[int, ...],
                            ) -> dict[str, tuple[int, ...]]:
    """``frontier.extra_budgets`` (typed by the schema: lists of distinct integers in 1..8),
    checked against the other keys: each scheme one of ``schemes`` (the grid's and the
    frontier's, in config order), with a frontier to run on; each budget outside ``budgets`` (a
    grid budget is already a cell) and realisable by the scheme. Schemes in config order."""
    given = cfg.get("extra_budgets") or {}
    frontier = list(cfg.get("schemes", []))
    for name, extra in given.items():
        key = f"config key frontier.extra_budgets.{name}"
        if name not in schemes:
            raise KvasymError(f"{key}: {name!r} is not one of schemes or frontier.schemes ({', '.join(schemes)})")
        if not frontier:
            raise KvasymError(f"{key}: frontier.schemes is empty, so there is no frontier to add {name}'s budgets to")
        for i, budget in enumerate(extra):
            if budget in budgets:
                raise KvasymError(f"{key}[{i}] = {budget} is already in budgets ({', '.join(map(str, budgets))}): "
                                  "an extra budget is one the grid does not run")
            try:
                schemes[name].validate_budget(budget)
            except KvasymError as exc:
                raise KvasymError(f"{key}[{i}] = {budget}: {exc}") from None
    return {name: tuple(sorted(int(b) for b in given[name])) for name in schemes if name in given}


def _frontier_real(cfg: Mapping[str, Any], frontier_schemes: Mapping[str, Scheme]) -> tuple[str, ...]:
    """The frontier schemes of the real rows (``frontier.real_schemes``, each a frontier scheme)."""
    chosen = cfg.get("real_schemes")
    if chosen is None:
        return tuple(frontier_schemes)
    for i, name in enumerate(chosen):
        if name not in frontier_schemes:
            raise KvasymError(f"config key frontier.real_schemes[{i}] = {name!r} is not one of frontier.schemes "
                              f"({', '.join(frontier_schemes) or 'none'})")
    return tuple(n for n in frontier_schemes if n in chosen)


def _frontier_real_query_aware(cfg: Mapping[str, Any], scheme_names: list[str]) -> tuple[str, ...]:
    """The query-aware variants measured per head on the real rows (``frontier.real_query_aware``:
    names of :data:`kvasym.real.queryaware.VARIANTS`, the schema's enum, none a scheme of the grid
    or frontier)."""
    chosen = list(cfg.get("real_query_aware") or [])
    _no_case_clash([*scheme_names, *chosen], "schemes, frontier.schemes and frontier.real_query_aware")
    for i, name in enumerate(chosen):
        if name in scheme_names:
            raise KvasymError(f"config key frontier.real_query_aware[{i}] = {name!r} is also a scheme of schemes or "
                              "frontier.schemes (their per-head rows would share files)")
    return tuple(chosen)


def _frontier_distributions(chosen: Any, distributions: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """The synthetic distributions of ``chosen`` in config order (each must be one)."""
    for i, name in enumerate(chosen):
        if name not in distributions:
            raise KvasymError(f"config key {key}[{i}] = {name!r} is not a synthetic distribution "
                              f"of the grid; known: {', '.join(distributions)}")
    return tuple(n for n in distributions if n in chosen)


def _query_variants(
    settings: Mapping[str, Any],
    distributions: dict[str, DistributionSpec],
    distribution_dims: dict[str, tuple[int, ...]],
    files: Mapping[str, Any],
) -> dict[str, dict[str, str]]:
    """Add the query-model variants of ``settings`` (the config's ``query_models``, typed and
    default-filled by the schema) to ``distributions`` and ``distribution_dims`` (in place) and
    return ``{variant: {"of": parent, "query": model}}``. Errors name the key."""
    from .querymodel import check_query_model, parse_query_model

    models = [parse_query_model(m, f"config key query_models.models[{i}]") for i, m in enumerate(settings["models"])]
    if not models:
        return {}
    chosen = settings["distributions"]
    if chosen == "all":
        parents = [name for name, spec in distributions.items() if spec.kind == "low_rank"]
    else:
        parents = list(chosen)
        for i, name in enumerate(parents):
            where = f"config key query_models.distributions[{i}]"
            if name in files or name not in distributions:
                raise KvasymError(f"{where} = {name!r} is not a synthetic distribution of the grid "
                                  f"({', '.join(distributions)})")
            if distributions[name].kind != "low_rank":
                raise KvasymError(f"{where} = {name!r} is of kind {distributions[name].kind}: query models are swept "
                                  "over low_rank distributions only (their keys have a subspace to align with)")
    wanted_dims = settings["dims"]
    variants: dict[str, dict[str, str]] = {}
    for parent in parents:
        spec = distributions[parent]
        dims = tuple(d for d in distribution_dims[parent] if wanted_dims == "all" or d in wanted_dims)
        if not dims:
            continue
        for model in models:
            name = f"{parent}+{model.name}"
            if name in distributions or name in files:
                raise KvasymError(f"config key query_models: the variant {name!r} of {parent} clashes with a "
                                  "distribution of that name")
            # an alignment above d / r (the subspace rule's own, the parent itself) does not exist at that d
            rank, noise = int(spec.params["rank"]), float(spec.params["noise"])
            own = tuple(d for d in dims if model.alignment is None
                        or model.alignment <= (d / rank + noise**2) / (1 + noise**2) * (1 + 1e-12))
            if not own:
                continue
            for dim in own:
                check_query_model(model, spec.kind, dim, rank, noise,
                                  f"config key query_models.models ({model.name} for {parent} at d = {dim})")
            distributions[name] = DistributionSpec(name=name, kind=spec.kind, params=dict(spec.params),
                                                   query=model.name, keys_of=parent)
            distribution_dims[name] = own
            variants[name] = {"of": parent, "query": model.name}
    _no_case_clash(list(distributions), "distributions[].name")
    return variants


def _check_sketch_dims(schemes: Mapping[str, Scheme], distribution_dims: Mapping[str, tuple[int, ...]]) -> None:
    """The hadamard sketch is square and orthogonal, so an unrotated side that uses it needs a
    power-of-two dimension (a rotated side is padded to one); refuse the grid before any job."""
    odd = sorted({d for dims in distribution_dims.values() for d in dims if d & (d - 1)})
    for name, scheme in schemes.items():
        for side in ("K", "V"):
            spec = scheme.side(side)
            if odd and spec.qjl and spec.sketch == "hadamard" and not spec.rotate:
                raise KvasymError(
                    f"scheme {name} side {side} uses the hadamard sketch without rotation, which needs a power-of-two "
                    f"dimension; the grid has dims {odd} (set rotate: true, which pads, or sketch: gaussian)"
                )


def headline_default(
    distribution_dims: Mapping[str, tuple[int, ...]], sharpness: tuple[float, ...], budgets: tuple[int, ...]
) -> dict[str, Any]:
    """The headline cell of a grid whose config names none: the first synthetic distribution
    (``distribution_dims`` holds only those, in config order), its first dim, the first
    sharpness, and :data:`HEADLINE_BUDGET` if the grid has it, else the largest budget."""
    distribution = next(iter(distribution_dims))
    return {
        "distribution": distribution,
        "dim": int(distribution_dims[distribution][0]),
        "sharpness": float(sharpness[0]),
        "budget": int(HEADLINE_BUDGET if HEADLINE_BUDGET in budgets else max(budgets)),
    }


def _headline(
    given: Mapping[str, Any],
    distribution_dims: Mapping[str, tuple[int, ...]],
    sharpness: tuple[float, ...],
    budgets: tuple[int, ...],
    files: Mapping[str, Any],
) -> dict[str, Any]:
    """The config's ``headline`` (already typed by the schema), its missing fields filled in, each
    checked against the grid. A given distribution's dim defaults to that distribution's first."""
    distribution = given.get("distribution", next(iter(distribution_dims)))
    if distribution not in distribution_dims:
        why = " (a file distribution cannot be the headline)" if distribution in files else ""
        raise KvasymError(
            f"config key headline.distribution: must be a synthetic distribution of the grid "
            f"({', '.join(distribution_dims)}), got {distribution!r}{why}"
        )
    default = headline_default({distribution: distribution_dims[distribution]}, sharpness, budgets)
    dims = distribution_dims[distribution]
    dim = given.get("dim", default["dim"])
    if dim not in dims:
        listed = ", ".join(map(str, dims))
        raise KvasymError(f"config key headline.dim: must be a dim of {distribution} ({listed}), got {dim}")
    chosen = given.get("sharpness", default["sharpness"])
    grid = [s for s in sharpness if math.isclose(s, chosen, rel_tol=1e-12)]
    if not grid:
        listed = ", ".join(f"{s:g}" for s in sharpness)
        raise KvasymError(f"config key headline.sharpness: must be one of sharpness ({listed}), got {chosen}")
    budget = given.get("budget", default["budget"])
    if budget not in budgets:
        listed = ", ".join(map(str, budgets))
        raise KvasymError(f"config key headline.budget: must be one of budgets ({listed}), got {budget}")
    return {"distribution": distribution, "dim": int(dim), "sharpness": grid[0], "budget": int(budget)}


FILE_KIND = "file"


def _file_distribution(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A bring-your-own cache entry ``{name, kind: file, params: {path, causal}}`` (typed and
    default-filled by the schema), checked without reading the file (the DAG reads its header:
    kvasym.cachefile.inspect_cache_file)."""
    from .cachefile import SUFFIXES

    where = f"distributions[{entry['name']}]"
    if "dims" in entry:
        raise KvasymError(f"{where}: a file distribution takes no dims (its dim is the file's head_dim)")
    params = entry["params"]
    if not params["path"].lower().endswith(SUFFIXES):
        raise KvasymError(f"{where}.params.path = {params['path']!r} must end in one of {', '.join(SUFFIXES)}")
    return {"name": entry["name"], "kind": FILE_KIND, "params": {"path": params["path"], "causal": params["causal"]}}


#: Largest float64 matrix one trial may need (2**31 entries = 16 GiB): each key is within its
#: own range, but seq_len x n_queries (the attention matrices) or seq_len x dim (K and V) can
#: still ask for terabytes, which would only surface as an out-of-memory kill mid-run.
MAX_TRIAL_ENTRIES = 2**31
#: The memory (MB) one job may need unless KVASYM_MAX_JOB_MEM_MB says otherwise (:func:`max_job_mem_mb`).
DEFAULT_MAX_JOB_MEM_MB = 65536


def max_job_mem_mb() -> int:
    """The largest memory (MB) one job may need: $KVASYM_MAX_JOB_MEM_MB, else 65536 (64 GiB)."""
    value = os.environ.get("KVASYM_MAX_JOB_MEM_MB", "")
    if not value:
        return DEFAULT_MAX_JOB_MEM_MB
    if not value.isdigit() or int(value) < 1:
        raise KvasymError(f"KVASYM_MAX_JOB_MEM_MB must be a positive integer (MB), got {value!r}")
    return int(value)


def _check_trial_size(seq_len: int, n_queries: int, max_dim: int, trials: int = 1,
                      sharpness: tuple[float, ...] = (1.0,)) -> None:
    for what, rows, cols in (("seq_len x n_queries", seq_len, n_queries), ("seq_len x dims", seq_len, max_dim)):
        if rows * cols > MAX_TRIAL_ENTRIES:
            raise KvasymError(
                f"config keys {what} = {rows} x {cols} = {rows * cols:.3g} float64 entries per trial "
                f"exceed {MAX_TRIAL_ENTRIES} (16 GiB per matrix); lower seq_len, n_queries or dims"
            )
    # a job holds several such matrices at once: its whole estimate must fit too
    from .resources import job_resources

    need = job_resources("metrics", {"dim": max_dim, "seq_len": seq_len, "n_queries": n_queries, "trials": trials,
                                     "sharpness": list(sharpness)})["mem_mb"]
    limit = max_job_mem_mb()
    if need > limit:
        raise KvasymError(
            f"config keys seq_len = {seq_len}, n_queries = {n_queries}, dims up to {max_dim}: a metrics job would "
            f"need about {need / 1024:.0f} GiB (kvasym.resources.job_resources), more than {limit} MB; lower them, "
            "or raise KVASYM_MAX_JOB_MEM_MB on a machine that has it"
        )


def _no_case_clash(names: list[str], key: str) -> None:
    """Names become folder names: two that differ only in case collide on case-insensitive
    filesystems (macOS, Windows), where one cell would silently overwrite the other."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise KvasymError(
                f"config key {key}: {other!r} and {name!r} differ only in case (they become folder names)"
            )
