"""The study's grid: a validated view of the config and the cells it spans.

The config (``config/config.yaml``, documented in ``config/README.md``) is checked in two steps:
the JSON schema (``workflow/schemas/config.schema.yaml``, types, ranges, unknown keys) and then
:func:`load_study`, which checks what a schema cannot (schemes realisable at every budget, ranks
within every dimension, unique names) and names the offending key in a :class:`KvasymError`.

A *cell* is (distribution, dim, scheme, budget); its data depend on (distribution, dim, trial)
only, so every scheme and budget sees the same keys, values and queries (a paired design).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .codebook import MAX_DIM, MIN_DIM
from .distributions import DistributionSpec
from .errors import KvasymError
from .schemes import MAX_BUDGET, MIN_BUDGET, Scheme, scheme_registry

TOP_KEYS = {
    "base_seed",
    "norm_dtype",
    "dims",
    "budgets",
    "schemes",
    "user_schemes",
    "seq_len",
    "n_queries",
    "trials",
    "per_key_trials",
    "sharpness",
    "distributions",
    "stats",
    "theory",
    "claims_file",
    "real",  # validated by kvasym.real.real_settings (the real-model rows; optional)
}
DISTRIBUTION_KEYS = {"name", "kind", "params", "dims"}
#: Defaults of optional keys; workflow/schemas/config.schema.yaml states the same (tested).
DEFAULTS: dict[str, Any] = {
    "base_seed": 0,
    "norm_dtype": "float32",
    "user_schemes": {},
    "seq_len": 256,
    "n_queries": 32,
    "trials": 8,
    "per_key_trials": 2,
    "sharpness": [1.0],
    "stats": {"n_boot": 1000, "n_permutations": 200, "energy_max_n": 512},
    "theory": {"trials": 8, "n_probes": 256, "n_boot": 1000},
    "claims_file": "config/claims.yaml",
}


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

    def file_slice(self, distribution: str, dim: int, scheme: str, budget: int) -> dict[str, Any]:
        """Everything a file cell's metrics job depends on besides the file itself."""
        if distribution not in self.files:
            raise KvasymError(f"unknown file distribution {distribution!r}")
        if scheme not in self.schemes:
            raise KvasymError(f"unknown scheme {scheme!r}")
        spec = self.schemes[scheme].to_dict()
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
        """Everything a quantize job depends on (the data slice, the scheme's spec, budget)."""
        if scheme not in self.schemes:
            raise KvasymError(f"unknown scheme {scheme!r}")
        out = self.data_slice(distribution, dim)
        spec = self.schemes[scheme].to_dict()
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
            "base_seed": self.base_seed,
            "stats": dict(self.stats),
        }

    def theory_slice(self, distribution: str, dim: int) -> dict[str, Any]:
        """What the theory job of (distribution, dim) depends on (data slice, budgets, settings)."""
        out = self.data_slice(distribution, dim)
        out.update(budgets=list(self.budgets), theory=dict(self.theory))
        return out

    def metrics_slice(self, distribution: str, dim: int, scheme: str, budget: int) -> dict[str, Any]:
        """A quantize slice plus what only the metrics depend on."""
        out = self.cell_slice(distribution, dim, scheme, budget)
        out.update(sharpness=list(self.sharpness), per_key_trials=self.per_key_trials)
        return out


def load_study_file(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> Study:
    """Read a YAML config (plus ``overrides``, as ``snakemake --config`` would) into a Study."""
    from .config_io import read_yaml_mapping

    config = read_yaml_mapping(path)
    config.update(overrides or {})
    try:
        return load_study(config)
    except KvasymError as exc:
        raise KvasymError(f"{path}: {exc}") from None


def parse_slice(text: str) -> dict[str, Any]:
    """A stage's ``--slice`` argument (JSON object) as a dict, or a KvasymError saying why not."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KvasymError(f"--slice is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KvasymError("--slice must be a JSON object")
    return data


def canonical_json(data: Mapping[str, Any]) -> str:
    """Sorted, compact JSON: a stable string for Snakemake params (its rerun trigger)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _int(value: Any, key: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvasymError(f"config key {key} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise KvasymError(f"config key {key} must be {bound}, got {value}")
    return value


def _int_list(value: Any, key: str, lo: int, hi: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise KvasymError(f"config key {key} must be a non-empty list, got {value!r}")
    items = tuple(_int(v, f"{key}[{i}]", lo, hi) for i, v in enumerate(value))
    if len(set(items)) != len(items):
        raise KvasymError(f"config key {key} has duplicates: {list(items)}")
    return items


def load_study(config: Mapping[str, Any]) -> Study:
    """Validate a config mapping (after the JSON schema filled defaults) into a :class:`Study`."""
    if not isinstance(config, Mapping):
        raise KvasymError("the config must be a mapping")
    unknown = set(config) - TOP_KEYS
    if unknown:
        raise KvasymError(f"unknown config key(s): {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(TOP_KEYS))}")
    missing = {"dims", "budgets", "schemes", "distributions"} - set(config)
    if missing:
        raise KvasymError(f"config is missing required key(s): {', '.join(sorted(missing))}")

    dims = _int_list(config["dims"], "dims", MIN_DIM, MAX_DIM)
    budgets = _int_list(config["budgets"], "budgets", MIN_BUDGET, MAX_BUDGET)
    user = config.get("user_schemes", DEFAULTS["user_schemes"])
    if not isinstance(user, Mapping):
        raise KvasymError("config key user_schemes must be a mapping of name -> {K: ..., V: ...}")
    registry = scheme_registry(user)
    names = config["schemes"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise KvasymError(f"config key schemes must be a non-empty list of scheme names, got {names!r}")
    if len(set(names)) != len(names):
        raise KvasymError(f"config key schemes has duplicates: {names}")
    _no_case_clash(names, "schemes")
    schemes: dict[str, Scheme] = {}
    for i, name in enumerate(names):
        if name not in registry:
            raise KvasymError(f"config key schemes[{i}] = {name!r} is not a known scheme; known: {', '.join(sorted(registry))}")
        for budget in budgets:
            registry[name].validate_budget(budget)
        schemes[name] = registry[name]

    sharpness = config.get("sharpness", DEFAULTS["sharpness"])
    if not isinstance(sharpness, list) or not sharpness:
        raise KvasymError(f"config key sharpness must be a non-empty list of positive numbers, got {sharpness!r}")
    for i, s in enumerate(sharpness):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < 1e6:
            raise KvasymError(f"config key sharpness[{i}] must be a positive number, got {s!r}")
    if len(set(sharpness)) != len(sharpness):
        raise KvasymError(f"config key sharpness has duplicates: {sharpness}")

    norm_dtype = config.get("norm_dtype", DEFAULTS["norm_dtype"])
    if norm_dtype not in ("float16", "float32"):
        raise KvasymError(f"config key norm_dtype must be float16 or float32, got {norm_dtype!r}")

    trials = _int(config.get("trials", DEFAULTS["trials"]), "trials", 1, 100_000)
    raw = config["distributions"]
    if not isinstance(raw, list) or not raw:
        raise KvasymError("config key distributions must be a non-empty list of {name, kind, params}")
    distributions: dict[str, DistributionSpec] = {}
    distribution_dims: dict[str, tuple[int, ...]] = {}
    files: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(raw):
        where = f"distributions[{i}]"
        if not isinstance(entry, Mapping):
            raise KvasymError(f"{where} must be a mapping with name, kind, params")
        extra = set(entry) - DISTRIBUTION_KEYS
        if extra:
            raise KvasymError(f"{where}: unknown key(s) {sorted(extra)}; allowed: {sorted(DISTRIBUTION_KEYS)}")
        if entry.get("kind") == FILE_KIND:
            file_spec = _file_distribution(entry, where)
            if file_spec["name"] in distributions or file_spec["name"] in files:
                raise KvasymError(f"{where}: duplicated distribution name {file_spec['name']!r}")
            _no_case_clash([*distributions, *files, file_spec["name"]], "distributions[].name")
            files[file_spec["name"]] = file_spec
            continue
        spec = DistributionSpec.from_dict({k: v for k, v in entry.items() if k != "dims"})
        if spec.name in distributions or spec.name in files:
            raise KvasymError(f"{where}: duplicated distribution name {spec.name!r}")
        _no_case_clash([*distributions, *files, spec.name], "distributions[].name")
        own_dims = _int_list(entry["dims"], f"{where}.dims", MIN_DIM, MAX_DIM) if "dims" in entry else dims
        for dim in own_dims:
            for key in ("rank", "n_outliers"):
                if key in spec.params and spec.params[key] > dim:
                    raise KvasymError(
                        f"distributions[{spec.name}].{key} = {spec.params[key]} exceeds dim = {dim}"
                    )
        distributions[spec.name] = spec
        distribution_dims[spec.name] = own_dims

    if not distributions:
        raise KvasymError(
            "config key distributions has no synthetic distribution (gaussian, student_t, low_rank, "
            "concentrated): the study's headline and theory checks need one; file caches are evaluated beside it"
        )
    per_key_trials = _int(config.get("per_key_trials", DEFAULTS["per_key_trials"]), "per_key_trials", 0, trials)
    seq_len = _int(config.get("seq_len", DEFAULTS["seq_len"]), "seq_len", 1, 10_000_000)
    n_queries = _int(config.get("n_queries", DEFAULTS["n_queries"]), "n_queries", 1, 10_000_000)
    _check_trial_size(seq_len, n_queries, max(max(d) for d in distribution_dims.values()))
    settings = {}
    for section in ("stats", "theory"):
        given = config.get(section, {})
        if not isinstance(given, Mapping):
            raise KvasymError(f"config key {section} must be a mapping")
        extra = set(given) - set(DEFAULTS[section])
        if extra:
            raise KvasymError(f"unknown config key(s) {', '.join(f'{section}.{k}' for k in sorted(extra))}")
        settings[section] = {
            key: _int(given.get(key, default), f"{section}.{key}", 1, 10**7)
            for key, default in DEFAULTS[section].items()
        }
    return Study(
        base_seed=_int(config.get("base_seed", DEFAULTS["base_seed"]), "base_seed", 0, 2**63 - 1),
        norm_dtype=norm_dtype,
        dims=dims,
        budgets=budgets,
        schemes=schemes,
        seq_len=seq_len,
        n_queries=n_queries,
        trials=trials,
        per_key_trials=per_key_trials,
        sharpness=tuple(float(s) for s in sharpness),
        distributions=distributions,
        distribution_dims=distribution_dims,
        stats=settings["stats"],
        theory=settings["theory"],
        claims_file=_claims_file(config.get("claims_file", DEFAULTS["claims_file"])),
        files=files,
    )


FILE_KIND = "file"
#: Parameters of a ``file`` distribution and their defaults (None: required).
FILE_PARAMS: dict[str, Any] = {"path": None, "causal": True}


def _file_distribution(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A bring-your-own cache entry ``{name, kind: file, params: {path, causal}}``, checked
    without reading the file (the DAG reads its header: kvasym.cachefile.inspect_cache_file)."""
    from .cachefile import SUFFIXES
    from .distributions import NAME_PATTERN

    name = entry.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise KvasymError(f"{where}.name must match {NAME_PATTERN.pattern}, got {name!r}")
    where = f"distributions[{name}]"
    if "dims" in entry:
        raise KvasymError(f"{where}: a file distribution takes no dims (its dim is the file's head_dim)")
    params = entry.get("params", {})
    if not isinstance(params, Mapping):
        raise KvasymError(f"{where}.params must be a mapping with path (and optionally causal)")
    unknown = sorted(set(params) - set(FILE_PARAMS))
    if unknown:
        raise KvasymError(f"{where}.params: unknown key(s) {unknown}; allowed: {sorted(FILE_PARAMS)}")
    path = params.get("path")
    if not isinstance(path, str) or not path.strip():
        raise KvasymError(f"{where}.params.path must be the path of a cache file, got {path!r}")
    if not path.lower().endswith(SUFFIXES):
        raise KvasymError(f"{where}.params.path = {path!r} must end in one of {', '.join(SUFFIXES)}")
    causal = params.get("causal", FILE_PARAMS["causal"])
    if not isinstance(causal, bool):
        raise KvasymError(f"{where}.params.causal must be true or false, got {causal!r}")
    return {"name": name, "kind": FILE_KIND, "params": {"path": path, "causal": causal}}


#: Largest float64 matrix one trial may need (2**31 entries = 16 GiB): each key is within its
#: own range, but seq_len x n_queries (the attention matrices) or seq_len x dim (K and V) can
#: still ask for terabytes, which would only surface as an out-of-memory kill mid-run.
MAX_TRIAL_ENTRIES = 2**31


def _check_trial_size(seq_len: int, n_queries: int, max_dim: int) -> None:
    for what, rows, cols in (("seq_len x n_queries", seq_len, n_queries), ("seq_len x dims", seq_len, max_dim)):
        if rows * cols > MAX_TRIAL_ENTRIES:
            raise KvasymError(
                f"config keys {what} = {rows} x {cols} = {rows * cols:.3g} float64 entries per trial "
                f"exceed {MAX_TRIAL_ENTRIES} (16 GiB per matrix); lower seq_len, n_queries or dims"
            )


def _no_case_clash(names: list[str], key: str) -> None:
    """Names become folder names: two that differ only in case collide on case-insensitive
    filesystems (macOS, Windows), where one cell would silently overwrite the other."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise KvasymError(f"config key {key}: {other!r} and {name!r} differ only in case (they become folder names)")


def _claims_file(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise KvasymError(f"config key claims_file must be a path to a YAML file, got {value!r}")
    return value


def job_resources(stage: str, slice_: Mapping[str, Any]) -> dict[str, int]:
    """Memory (MB) and runtime (minutes) to request for one job, from the size of its slice.

    Jobs loop over trials, so memory follows one trial's float64 arrays (K, V, Q, their
    reconstructions and the n_queries x seq_len attention matrices) plus, for quantize and
    metrics, the whole cell's packed caches; runtime follows the total work. The same formula
    serves every stage (``stage`` is accepted for when they diverge). The constants are
    conservative guesses, not a fit: the paper run's ``benchmark:`` files show a peak RSS of
    403 MB for any job, below the 600 MB floor requested here.
    """
    dim, seq, nq, trials = slice_["dim"], slice_["seq_len"], slice_["n_queries"], slice_["trials"]
    per_trial = 8 * (6 * seq * dim + 2 * nq * dim + 12 * nq * seq)
    packed = trials * 2 * seq * (dim + 64)  # <= 8 bits per coordinate + norms, both sides
    mem_mb = 600 + (3 * per_trial + 2 * packed) // 2**20
    work = trials * seq * dim * (1 + (len(slice_.get("sharpness", [])) or 1))
    runtime = 2 + work // 50_000_000
    return {"mem_mb": int(mem_mb), "runtime": int(runtime)}
