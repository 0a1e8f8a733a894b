"""One home per stage: a rule's name is its stage's name, its module's name and its
``kvasym stage`` subcommand, and every rule calls its stage the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cell_files import DERIVED_RTOL, FLOAT32_RTOL
from kvasym.cli import main
from kvasym.dataset import read_metrics_file
from kvasym.resources import FIXED_RESOURCES, SLICE_STAGES, job_resources
from kvasym.stages import STAGES, stage_module

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted((ROOT / "workflow/rules").glob("*.smk"))


def _rules() -> dict[str, str]:
    """Rule name -> its text (up to the next rule), from every rule file."""
    out = {}
    for path in RULES:
        text = path.read_text()
        for match in re.finditer(r"^\s*rule (\w+):\n(.*?)(?=^\s*rule \w*:|\Z)", text, re.M | re.S):
            out[match.group(1)] = match.group(2)
    return out


def test_every_rule_runs_the_stage_of_its_own_name():
    rules = _rules()
    assert {"cells", "metrics", "stats", "theory", "gather", "claims", "tables", "numbers", "paper",
            "capture", "real_metrics", "real_cachestats", "file_metrics"} <= set(rules)
    for name, body in rules.items():
        called = re.findall(r"kvasym stage (\w+)", body)
        assert called == [name], f"rule {name} calls {called or 'no stage'}; it must call `kvasym stage {name}`"
        assert "python -m" not in body, f"rule {name} reaches the library another way"
    figures = (ROOT / "workflow/rules/figures.smk").read_text()
    assert 'f"figure_{_family}"' in figures and re.findall(r"kvasym stage (\w+)", figures) == ["figure"]
    assert set(STAGES) == set(rules) | {"figure"}, "a stage without a rule, or a rule without a stage"


def test_rules_hold_no_lambdas_and_no_resource_numbers():
    for path in RULES:
        text = path.read_text()
        if path.name == "common.smk":
            continue
        assert "lambda" not in text, f"{path.name}: input functions live in common.smk"
        assert not re.search(r"mem_mb\s*=\s*\d|runtime\s*=\s*\d", text), \
            f"{path.name}: resources come from kvasym.resources"


@pytest.mark.parametrize("name", list(STAGES))
def test_each_stage_module_has_one_entry_point(name, capsys):
    module = stage_module(name)
    assert module.__name__ == f"kvasym.stages.{name}"
    assert callable(module.add_arguments) and callable(module.run)
    with pytest.raises(SystemExit) as exit_info:
        main(["stage", name, "--help"])
    assert exit_info.value.code == 0
    assert STAGES[name] in " ".join(capsys.readouterr().out.split())


def test_resources_cover_every_stage():
    for name in STAGES:
        if name in SLICE_STAGES:
            request = job_resources(name, {"dim": 128, "seq_len": 256, "n_queries": 32, "trials": 32,
                                           "sharpness": [1.0]})
        else:
            request = job_resources(name, input_mb=100.0)
        assert request["mem_mb"] >= 600 and request["runtime"] >= 2, name
    assert job_resources("file_metrics", input_mb=100.0)["mem_mb"] == FIXED_RESOURCES["file_metrics"][0] + 300
    with pytest.raises(ValueError, match="follow its slice"):
        job_resources("metrics")
    with pytest.raises(ValueError, match="no resource model"):
        job_resources("nope")


def _modules(stage: str) -> set[str]:
    from kvasym.stages import stage_code_files

    root = ROOT / "src"
    return {str(p.relative_to(root)) for p in stage_code_files(stage)}


def test_a_stage_reruns_when_the_code_it_runs_changes_and_only_then():
    """Issue 18, class 5: every rule passes the digest of its stage's code as a param, so
    Snakemake's params trigger reruns it when that code changes: a template edit rebuilds the
    tables, a figure edit redraws figures only, a metrics edit recomputes metrics and what follows."""
    from kvasym.stages import stage_code_digest

    for name, body in _rules().items():
        assert f'code=STAGE_CODE["{name}"]' in body, f"rule {name} does not pass its code digest"
    assert "code=FIGURE_CODE[_family]" in (ROOT / "workflow/rules/figures.smk").read_text()
    assert "kvasym/metrics.py" in _modules("cells") and "kvasym/cache.py" in _modules("cells")
    # every figure module, the family modules the registry's drawing callables import included
    # (the package's __init__ is its docstring only)
    figure_modules = {f"kvasym/render/figures/{p.name}" for p in (ROOT / "src/kvasym/render/figures").glob("*.py")
                      if p.name != "__init__.py"}
    assert len(figure_modules) > 10 and figure_modules <= _modules("figure")
    assert not figure_modules & _modules("metrics")
    assert "kvasym/templates/table_results.tex.j2" in _modules("tables")
    assert not any("templates" in m or m.startswith("kvasym/render") for m in _modules("metrics"))
    assert "kvasym/render/claims.py" in _modules("claims") and "kvasym/stats.py" in _modules("stats")
    # lazy imports inside functions count: the figure stage imports the library inside load_inputs
    assert {"kvasym/stages/figure.py", "kvasym/theory.py", "kvasym/real/layer_means.py"} <= _modules("figure")
    # the gather stage computes the query-model table with the claims' own interval
    assert "kvasym/claims.py" in _modules("gather")
    digests = {name: stage_code_digest(name) for name in STAGES}
    assert len(set(digests.values())) == len(digests)  # each stage runs its own code
    assert all(len(d) == 64 for d in digests.values())


def _stage_digests(src: Path, cache: Path) -> dict[str, str]:
    """Every stage's code digest computed from the package at ``src`` (a fresh process)."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json; from kvasym.stages import STAGES, stage_code_digest; "
            "print(json.dumps({s: stage_code_digest(s) for s in STAGES}))")
    env = {**os.environ, "PYTHONPATH": str(src), "KVASYM_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


# (file under src/kvasym, text, its replacement, the stages whose digest must change: None for
# "every stage that imports the module", or a predicate's name)
REGISTRY_EDITS = [
    # a description reaches the scheme table through the tables stage's params, never a digest
    ("schemes.py", '"WHT; n-bit scalar on both sides, no QJL (TurboQuant_mse as deployed)"',
     '"WHT; n-bit scalar on both sides, no QJL (reworded)"', set()),
    # a memory request or a thread count never changes a result
    ("resources.py", '"tables": (1000, 5)', '"tables": (1100, 5)', set()),
    ("resources.py", '"card": 8,', '"card": 6,', set()),
    # the crate alone prints an artifact's description
    ("artifacts.py", '"the rate-distortion frontier\'s points (measured total bits against damage)"',
     '"the frontier\'s points"', {"crate"}),
    # a job's log and benchmark layout: what reads every log or benchmark file
    ("artifacts.py", '"frontier": "frontier",', '"frontier": "frontier_job",', {"crate", "reproduce"}),
    # a path: its writer and the stages that name it (the others find it through their files)
    ("artifacts.py", 'f"{_R}/frontier/points.parquet"', 'f"{_R}/frontier/points_v2.parquet"', "names"),
    # a built-in scheme's spec: the stages that name it (a job running it reads it from its slice)
    ("schemes.py", '"V": {"rotate": True, "scalar_bits": "n", "qjl": False},\n    },\n    # Built',
     '"V": {"rotate": True, "scalar_bits": "n - 1", "qjl": False},\n    },\n    # Built', "names"),
    # a stage's description is the help of its subcommand; the crate prints it
    ("stages/__init__.py", '"frontier": "rate-distortion frontier:', '"frontier": "the frontier:', {"crate"}),
    # a model's entry: the stages that print every model (its own jobs record it in their params)
    ("real/model_registry.py", 'name="SmolLM2-135M"', 'name="SmolLM2 135M"', "model readers"),
    # a model added: the same stages, and no job of another model
    ("real/model_registry.py", '    "gemma3-270m": ModelEntry(',
     '    "other-1b": ModelEntry(key="other-1b", name="Other 1B", n_layers=16, n_kv_heads=8, head_dim=64),\n'
     '    "gemma3-270m": ModelEntry(', "model readers"),
    # code in a registry module is code: every stage that imports it
    ("artifacts.py", "\ndef pattern(name: str) -> str:\n", "\ndef pattern(name: str) -> str:\n    name = str(name)\n",
     None),
]


@pytest.mark.parametrize("module, old, new, changed", REGISTRY_EDITS,
                         ids=["description", "memory", "threads", "artifact-description", "job-key", "path",
                              "scheme-spec", "stage-description", "model-name", "model-added", "code"])
def test_a_registry_entry_changes_the_digests_of_the_stages_that_read_it(tmp_path, module, old, new, changed):
    """Issue 48, point 3: the registry tables (kvasym.stages._registries) count in a stage's code
    digest by the entries it reads. Editing one entry changes the digests of the stages that can
    read it, and no other (before, 22 to 29 of the 30 stages reran for any entry)."""
    import shutil

    from kvasym.stages import stage_code_files
    from kvasym.stages._registries import registry_entries

    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    before = _stage_digests(src, tmp_path / "cache")
    path = src / "kvasym" / module
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")
    after = _stage_digests(src, tmp_path / "cache")
    moved = {stage for stage in STAGES if before[stage] != after[stage]}
    if changed is None:
        expected = {s for s in STAGES if f"kvasym/{module}" in _modules(s)}
        assert len(expected) >= 20
    elif changed == "names":
        key = "frontier_points" if module == "artifacts.py" else "RKV"
        table = "artifacts" if module == "artifacts.py" else "schemes"
        expected = {s for s in STAGES if key in registry_entries(s, stage_code_files(s), STAGES)[table]}
        assert 0 < len(expected) < len(STAGES) - 2, expected
        if key == "frontier_points":  # its writer, and the renderers that print or read its path
            assert {"frontier", "crate"} <= expected and not {"cells", "e2e", "passkey", "capture"} & expected
    elif changed == "model readers":
        from kvasym.stages._registries import MODEL_FREE_STAGES, MODEL_JOB_STAGES

        expected = set(STAGES) - MODEL_FREE_STAGES - MODEL_JOB_STAGES
        assert {"tables", "numbers", "figure", "crate"} <= expected and not {"cells", "e2e", "passkey"} & expected
    else:
        expected = changed
    assert moved == expected, (sorted(moved - expected), sorted(expected - moved))


def test_a_figure_familys_digest_follows_its_own_drawing_modules(tmp_path):
    """Each figure family's job has its own code digest (stage_code_digest("figure", family)): the
    figure stage's code without the modules only the other families' drawing callables import, so
    editing one family's module redraws that family alone, and editing the shared style all."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from kvasym.render.figures.registry import FIGURE_FAMILIES

    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    code = ("import json; from kvasym.stages import stage_code_digest; "
            "from kvasym.render.figures.registry import FIGURE_FAMILIES; "
            "print(json.dumps({f: stage_code_digest('figure', f) for f in FIGURE_FAMILIES}))")
    env = {**os.environ, "PYTHONPATH": str(src), "KVASYM_CACHE_DIR": str(tmp_path / "cache")}

    def digests() -> dict[str, str]:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    before = digests()
    # each family runs its own code (e2e and e2e_context draw from the same module: one digest)
    assert len(set(before.values())) == len(FIGURE_FAMILIES) - 1 and before["e2e"] == before["e2e_context"]
    for module, families in (("kl_ecdf.py", {"kl_ecdf"}), ("e2e.py", {"e2e", "e2e_context", "frontier"}),
                             ("_style.py", set(FIGURE_FAMILIES))):
        path = src / "kvasym/render/figures" / module
        path.write_text(path.read_text(encoding="utf-8") + "\n_EDITED_FOR_A_TEST = 1\n", encoding="utf-8")
        after = digests()
        assert {f for f in FIGURE_FAMILIES if after[f] != before[f]} == families, module
        before = after


def test_the_stages_said_to_read_no_model_entry_look_none_up():
    """Issue 48, point 3: the digests of MODEL_FREE_STAGES leave the model registry out, which is
    right only if none of their modules looks an entry up when the job runs: the registry itself,
    the config reader (kvasym.real) and the slice builder (kvasym.study) use it when the DAG is
    built, and their results reach a job through its slice. A model-level stage records its own
    model's entry in its params instead; every other stage hashes the registry whole."""
    from kvasym.stages import stage_code_files
    from kvasym.stages._registries import MODEL_FREE_STAGES, MODEL_JOB_STAGES

    lookup = re.compile(r"\b(MODELS|model_entry|slice_model|load_model|ModelEntry|model_section)\b")
    built_with_the_dag = {"kvasym/real/model_registry.py", "kvasym/real/__init__.py", "kvasym/study.py"}
    assert MODEL_FREE_STAGES <= set(STAGES) and MODEL_JOB_STAGES <= set(STAGES)
    assert not MODEL_FREE_STAGES & MODEL_JOB_STAGES
    for stage in sorted(MODEL_FREE_STAGES):
        readers = [str(p.relative_to(ROOT / "src")) for p in stage_code_files(stage) if p.suffix == ".py"
                   and str(p.relative_to(ROOT / "src")) not in built_with_the_dag and lookup.search(p.read_text())]
        assert not readers, (stage, readers)
    # a model-level stage's jobs each run one model: what it writes is filed under {model} (or {stem})
    from kvasym.artifacts import ARTIFACTS

    for stage in sorted(MODEL_JOB_STAGES):
        assert any(stage in item.writers and re.search(r"\{(model|stem)\}", item.template)
                   for item in ARTIFACTS.values()), stage


def test_a_model_level_job_records_its_models_entry():
    """The params Snakemake compares for a model-level job hold its model's registry entry (so
    editing that entry reruns its jobs, kvasym.stages._registries); a synthetic job's do not."""
    import json

    from kvasym.real.model_registry import MODELS, PRIMARY
    from kvasym.wiring import Wiring

    wiring = Wiring(yaml.safe_load((ROOT / "config/test.yaml").read_text()), [str(ROOT / "config/test.yaml")])
    e2e = json.loads(wiring.stage_params("e2e")["config"]({"model": PRIMARY, "text": "bicycle_repair", "part": "0"}))
    assert e2e["model_entry"]["name"] == MODELS[PRIMARY].name and e2e["model_entry"]["key"] == PRIMARY
    assert e2e["model_entry"]["n_layers"] == MODELS[PRIMARY].n_layers
    cells = json.loads(wiring.stage_params("cells")["config"]({"distribution": "gaussian", "dim": "64"}))
    assert "model_entry" not in cells


def test_the_import_scan_finds_what_parsing_each_module_finds():
    """The code digests scan only the import statements of each module (fast enough for the
    per-job Snakemake processes of a Slurm group job); parsing the whole module is the
    reference, for every module of the package, and prose that reads like an import is skipped."""
    from kvasym import stages

    package = ROOT / "src" / "kvasym"
    checked = 0
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(ROOT / "src").with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        assert stages._imports(path, module) == stages._imports_by_parsing(path, module), module
        checked += 1
    assert checked > 50
    assert "kvasym.cache" in stages._imports(package / "stages" / "cells.py", "kvasym.stages.cells")


def test_the_import_scan_reads_lazy_multiline_and_relative_imports(tmp_path):
    from kvasym import stages

    source = tmp_path / "mod.py"
    source.write_text(
        '"""A docstring line:\nimport the data, from kvasym import nothing here.\n"""\n'
        "import numpy as np\n"
        "from .cache import (\n    quantize,  # the hot path\n    save_packed,\n)\n"
        "def f():\n    from ..figures import draw\n    import kvasym.theory\n"
    )
    found = stages._imports(source, "kvasym.stages.mod")
    assert found == stages._imports_by_parsing(source, "kvasym.stages.mod")
    assert found == {"kvasym.stages.cache", "kvasym.stages.cache.quantize", "kvasym.stages.cache.save_packed",
                     "kvasym.figures", "kvasym.figures.draw", "kvasym.theory"}


def test_the_cells_stage_writes_what_the_reference_computes_cell_by_cell(small_data, tmp_path, capsys):
    """Issue 29, item 1: one job per (distribution, dim) draws the data once and writes every
    cell's packed caches and metrics. Each cell is checked against an independent computation
    of that cell alone on the numpy reference path (quantize_pair, trial_metrics_multi): the
    packed caches equal, the metrics to float rounding (the compiled WHT adds in another order).
    A unit that fails leaves none of its folders; a damaged file in a unit folder sends the
    folder aside, so that Snakemake reruns the unit (it cannot see a file missing inside it)."""
    import numpy as np

    from kvasym.cache import load_packed
    from kvasym.evaluate import quantize_pair
    from kvasym.manifest import load_manifest, verified_trial
    from kvasym.metrics import trial_metrics_multi
    from kvasym.stages.cells import run_cells
    from kvasym.stages.metrics import unit_cells
    from kvasym.study import canonical_json

    study, slice_, _ = small_data
    unit = study.unit_slice("gaussian", 64)
    assert [s["name"] for s in unit["schemes"]] == study.unit_schemes("gaussian")
    assert len(unit["schemes"]) > len(study.schemes)  # the frontier's schemes on gaussian are in the unit
    # under a results/ folder, where the DAG writes: only there is a damaged file its to move aside
    tmp_path = tmp_path / "dag" / "results"
    tmp_path.mkdir(parents=True)
    out = {name: tmp_path / name for name in ("manifest.json", "packed", "pq", "pk")}
    run_cells(unit, out["manifest.json"], out["packed"], out["pq"], out["pk"])
    digests = load_manifest(out["manifest.json"], slice_)
    cells = list(unit_cells(unit))
    # every scheme at every budget, and RKV at its extra n = 5 (frontier.extra_budgets)
    assert len(cells) == len(unit["schemes"]) * len(study.budgets) + 1 and unit["extra_budgets"] == {"RKV": [5]}
    # the packed caches kept are the grid's at the grid's budgets (frontier.keep_packed is false by default)
    assert unit["packed_schemes"] == list(study.schemes)
    assert sorted(p.name for p in out["packed"].iterdir() if p.is_dir()) == sorted(study.schemes)
    for scheme, budget, cell in cells:
        assert canonical_json(cell) == canonical_json(study.metrics_slice("gaussian", 64, scheme.name, budget))
        kept = scheme.name in unit["packed_schemes"] and budget in study.budgets
        caches = load_packed(out["packed"] / scheme.name / f"n{budget}.npz") if kept else None
        frame = read_metrics_file(out["pq"] / scheme.name / f"n{budget}.parquet")
        assert set(frame.trial) == {0, 1} and (frame.scheme == scheme.name).all() and (frame.budget == budget).all()
        for trial in range(2):
            data = verified_trial(slice_, trial, digests)
            ref = quantize_pair(data.keys, data.values, scheme, budget, base_seed=study.base_seed,
                                identity=("gaussian", 64, trial), norm_dtype=study.norm_dtype, kernel="numpy")
            for side in ("K", "V") if kept else ():
                stored, want = caches[f"t{trial}.{side}"].arrays(), ref[side].arrays()
                assert stored.keys() == want.keys()
                for key in want:
                    np.testing.assert_array_equal(stored[key], want[key], err_msg=f"{scheme.name} n{budget} {key}")
            want_q = trial_metrics_multi(data.queries, data.keys, data.values, ref["K"].dequantize("float64"),
                                         ref["V"].dequantize("float64"), study.sharpness)
            for sharp, (per_query, _) in zip(study.sharpness, want_q):
                got = frame[(frame.trial == trial) & np.isclose(frame.sharpness, sharp)]
                np.testing.assert_allclose(got.kl.to_numpy(), per_query["kl"], rtol=FLOAT32_RTOL, atol=1e-15)
                np.testing.assert_allclose(got.t_eps_dir.to_numpy(), per_query["t_eps_dir"], rtol=DERIVED_RTOL,
                                           atol=1e-15)
    # a unit that fails (here: a query-model variant given to the cells stage) writes nothing
    with pytest.raises(Exception, match="query-model variant"):
        run_cells({**unit, "distribution": {**unit["distribution"], "keys_of": "x"}}, tmp_path / "m2.json",
                  tmp_path / "packed2", tmp_path / "pq2", tmp_path / "pk2")
    assert not any((tmp_path / name).exists() for name in ("m2.json", "packed2", "pq2", "pk2"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    # the stats stage given a damaged file of a unit folder: exit 2, one line, the folder aside
    damaged = out["pq"] / "KQV" / "n4.parquet"
    damaged.write_bytes(damaged.read_bytes()[:100])
    files = [str(out["pq"] / s / f"n{b}.parquet") for s in study.schemes for b in study.budgets]
    cells_json = canonical_json([{"scheme": s, "budget": b} for s in study.schemes for b in study.budgets])
    code = main(["stage", "stats", "--slice", canonical_json(study.stats_slice("gaussian", 64)), "--per-query",
                 *files, "--cells", cells_json, "--comparisons", str(tmp_path / "c.parquet"), "--summary",
                 str(tmp_path / "s.parquet"), "--trials", str(tmp_path / "t.parquet")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in last and last.endswith("moved aside to .pq.damaged; rerun and the "
                                                                   "rule that writes it rebuilds it"), last
    assert not out["pq"].exists() and (tmp_path / ".pq.damaged" / "KQV" / "n4.parquet").is_file()


def test_cells_jobs_import_only_what_they_use(small_data, tmp_path):
    """Issue 19, item 3 (one cells job since issue 29): a quantize or metrics job imported pandas
    (pyarrow's ``pa.array`` imports it on every call), jsonschema and the config schema (``kvasym.study``, for a JSON
    ``--slice``) and the capture command's module: about a third of a d = 128 job. They are now
    imported only where used, and the tables are built from column buffers (the same bytes)."""
    import json
    import os
    import subprocess
    import sys

    from kvasym.study import canonical_json

    from kvasym.codebook import lloyd_max_codebook

    study, _, manifest = small_data
    # a cold codebook cache computes the Beta codebook once, with scipy.special: warm the ones the
    # KQV n = 4 job reads (4 and 3 bits at d = 64) in the cache the job shares, so the test sees
    # the job's own imports whatever ran before it (it was order-dependent under xdist)
    for bits in (3, 4):
        lloyd_max_codebook(64, bits)
    script = ("import sys\nfrom kvasym.cli import main\ncode = main(sys.argv[1:])\n"
              "heavy = ('pandas', 'scipy', 'matplotlib', 'seaborn', 'jsonschema', 'kvasym.study', "
              "'kvasym.real.capture')\n"
              # numba's own import loads scipy (its linalg support): paid once by the unit's job
              "numba = 'numba' in sys.modules\n"
              "print(code, sorted(m for m in heavy if m in sys.modules and not (numba and m == 'scipy')))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                      if p)}
    jobs = {
        "cells": ["--slice", canonical_json(study.unit_slice("gaussian", 64)), "--manifest", str(manifest),
                  "--packed", str(tmp_path / "packed"), "--per-query", str(tmp_path / "pq"),
                  "--per-key", str(tmp_path / "pk")],
    }
    for stage, flags in jobs.items():
        proc = subprocess.run([sys.executable, "-c", script, "stage", stage, *flags], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.stdout.strip() == "0 []", (stage, proc.stdout, proc.stderr)
    # the buffer-built columns are what pyarrow's own conversion gives
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvasym.dataset import PER_QUERY_SCHEMA, _arrow_column, to_table

    table = pq.read_table(tmp_path / "pq" / "KQV" / "n4.parquet")
    assert table.schema.remove_metadata() == PER_QUERY_SCHEMA and table.num_rows == 2 * 4 * 2
    columns = {f.name: table.column(f.name).to_numpy() for f in PER_QUERY_SCHEMA}
    columns.update({f.name: columns[f.name].astype(str) for f in PER_QUERY_SCHEMA if pa.types.is_string(f.type)})
    assert to_table(columns, PER_QUERY_SCHEMA).equals(table.replace_schema_metadata(None))
    cases = [(np.array(["a", "h\u00e9llo", "", "a"]), pa.string()), (np.zeros(0, dtype=object), pa.string()),
             (np.array([1.0, np.nan, -0.0]), pa.float64()), (np.array([1, 2, 300]), pa.int32()),
             (np.zeros(0, dtype=np.int64), pa.int8()), (np.array([1.5], dtype=np.float32), pa.float64())]
    for values, type_ in cases:
        ours, theirs = _arrow_column(values, type_), pa.array(values, type=type_, safe=True)
        ours.validate(full=True)
        assert ours.type == theirs.type and json.dumps(ours.to_pylist()) == json.dumps(theirs.to_pylist())
    for values, type_ in [(np.array([300]), pa.int8()), (np.array([1.5]), pa.int32())]:
        with pytest.raises(pa.ArrowInvalid):  # refused as pyarrow refuses it
            _arrow_column(values, type_)


def test_frontier_packed_caches_are_written_only_when_kept(small_data, tmp_path):
    """Issue 29, item 4: a unit job writes the packed caches of its packed_schemes, the grid's by
    default and every scheme's with frontier.keep_packed; the metrics of every cell are written
    either way and do not depend on it; a packed_schemes naming no scheme of the unit is refused."""
    from pathlib import Path

    import pandas as pd
    import yaml

    from kvasym.errors import KvasymError
    from kvasym.stages.cells import run_cells
    from kvasym.study import load_study

    study, _, _ = small_data
    config = {**yaml.safe_load((Path(__file__).resolve().parents[1] / "config/test.yaml").read_text()),
              "trials": 2, "seq_len": 32, "n_queries": 4}
    assert load_study(config) == study
    kept = load_study({**config, "frontier": {**config["frontier"], "keep_packed": True}})
    assert study.packed_schemes("gaussian") == list(study.schemes)
    assert kept.packed_schemes("gaussian") == kept.unit_schemes("gaussian")
    assert len(kept.unit_schemes("gaussian")) > len(study.schemes)
    tables = {}
    for label, s in (("default", study), ("kept", kept)):
        out = tmp_path / label
        run_cells(s.unit_slice("gaussian", 64), out / "m.json", out / "packed", out / "pq", out / "pk")
        assert sorted(p.name for p in (out / "packed").iterdir() if p.is_dir()) == sorted(s.packed_schemes("gaussian"))
        assert sorted(p.name for p in (out / "pq").iterdir() if p.is_dir()) == sorted(s.unit_schemes("gaussian"))
        tables[label] = pd.read_parquet(out / "pq")
    pd.testing.assert_frame_equal(tables["default"], tables["kept"])
    unit = {**study.unit_slice("gaussian", 64), "packed_schemes": ["KV", "NOPE"]}
    with pytest.raises(KvasymError, match=r"packed_schemes names \['NOPE'\]"):
        run_cells(unit, tmp_path / "x.json", tmp_path / "xp", tmp_path / "xq", tmp_path / "xk")
    assert not any((tmp_path / n).exists() for n in ("x.json", "xp", "xq", "xk"))


def test_extra_budgets_add_frontier_cells_and_leave_every_other_cell_bit_identical(small_data, tmp_path):
    """Issue 31, point 7: ``frontier.extra_budgets: {RKV: [5]}`` adds the cell RKV n = 5 to a
    frontier unit. Every cell the unit had is byte for byte the file it was without the key (seeds
    come from the cell's identity, not the order of work); the new cell is RKV quantized on its
    own at n = 5 with the cell's seeds (kvasym.evaluate.quantize_pair, the numpy reference) and
    measured against the data; its packed cache is written only with frontier.keep_packed."""
    import json
    from pathlib import Path

    import numpy as np
    import pandas as pd
    import yaml

    from kvasym.cache import load_packed
    from kvasym.dataset import read_metadata
    from kvasym.evaluate import quantize_pair
    from kvasym.manifest import load_manifest, verified_trial
    from kvasym.metrics import trial_metrics_multi
    from kvasym.stages.cells import run_cells
    from kvasym.study import canonical_json, load_study

    _, slice_, manifest = small_data
    config = {**yaml.safe_load((Path(__file__).resolve().parents[1] / "config/test.yaml").read_text()),
              "trials": 2, "seq_len": 32, "n_queries": 4}
    frontier = {k: v for k, v in config["frontier"].items() if k != "extra_budgets"}
    studies = {"without": load_study({**config, "frontier": frontier}),
               "with": load_study({**config, "frontier": {**frontier, "extra_budgets": {"RKV": [5]}}}),
               "kept": load_study({**config, "frontier": {**frontier, "extra_budgets": {"RKV": [5]},
                                                          "keep_packed": True}})}
    out = {}
    for label, study in studies.items():
        out[label] = tmp_path / label
        run_cells(study.unit_slice("gaussian", 64), out[label] / "m.json", out[label] / "packed", out[label] / "pq",
                  out[label] / "pk")
    base = studies["without"]
    old_cells = [(s, b) for s in base.unit_schemes("gaussian") for b in base.budgets]
    new_files = sorted(str(p.relative_to(out["with"] / "pq")) for p in (out["with"] / "pq").rglob("*.parquet"))
    assert new_files == sorted([*(f"{s}/n{b}.parquet" for s, b in old_cells), "RKV/n5.parquet"])
    for scheme, budget in old_cells:
        for table in ("pq", "pk"):
            name = Path(scheme) / f"n{budget}.parquet"
            assert (out["with"] / table / name).read_bytes() == (out["without"] / table / name).read_bytes(), name
    assert (out["with"] / "m.json").read_bytes() == (out["without"] / "m.json").read_bytes()
    # the grid's packed caches are the same arrays; RKV n = 5's is kept only with keep_packed
    for scheme in base.schemes:
        for budget in base.budgets:
            before, after = (load_packed(out[k] / "packed" / scheme / f"n{budget}.npz") for k in ("without", "with"))
            assert before.keys() == after.keys()
            for name in before:
                for key, want in before[name].arrays().items():
                    np.testing.assert_array_equal(after[name].arrays()[key], want)
    assert not (out["with"] / "packed" / "RKV" / "n5.npz").exists()
    kept = load_packed(out["kept"] / "packed" / "RKV" / "n5.npz")
    pd.testing.assert_frame_equal(pd.read_parquet(out["kept"] / "pq"), pd.read_parquet(out["with"] / "pq"))
    # the new cell against RKV quantized alone at n = 5 with the cell's seeds
    study = studies["with"]
    frame = read_metrics_file(out["with"] / "pq" / "RKV" / "n5.parquet")
    digests = load_manifest(manifest, slice_)
    for trial in range(2):
        data = verified_trial(slice_, trial, digests)
        ref = quantize_pair(data.keys, data.values, study.scheme("RKV"), 5, base_seed=study.base_seed,
                            identity=("gaussian", 64, trial), norm_dtype=study.norm_dtype, kernel="numpy")
        for side in ("K", "V"):
            for key, want in ref[side].arrays().items():
                np.testing.assert_array_equal(kept[f"t{trial}.{side}"].arrays()[key], want, err_msg=key)
        rows = frame[frame.trial == trial]
        # d = 64: 5 payload bits and one float32 norm per row of 64 coordinates, 0.5 side bits
        assert (rows.k_bits_payload == 5.0).all() and (rows.v_bits_payload == 5.0).all()
        assert (rows.k_bits_side == ref["K"].bits_per_coordinate()["side"]).all()
        want_q = trial_metrics_multi(data.queries, data.keys, data.values, ref["K"].dequantize("float64"),
                                     ref["V"].dequantize("float64"), study.sharpness)
        for sharp, (per_query, _) in zip(study.sharpness, want_q):
            got = rows[np.isclose(rows.sharpness, sharp)]
            np.testing.assert_allclose(got.kl.to_numpy(), per_query["kl"], rtol=FLOAT32_RTOL, atol=1e-15)
            np.testing.assert_allclose(got.t_eps_dir.to_numpy(), per_query["t_eps_dir"], rtol=DERIVED_RTOL, atol=1e-15)
    assert canonical_json(study.metrics_slice("gaussian", 64, "RKV", 5)) == canonical_json(
        json.loads(read_metadata(out["with"] / "pq" / "RKV" / "n5.parquet")["config_slice"]))


def test_gather_writes_the_query_model_table_of_the_gathered_trials(tmp_path, capsys):
    """Issue 30: the query-model figure's points are computed once, by stage gather from the
    gathered trials with the claims' own procedure (kvasym.claims.query_model_points), and
    written to the catalogue's query_model table; the figure only reads it."""
    import json

    import pandas as pd

    from kvasym.artifacts import ARTIFACTS
    from kvasym.claims import query_model_points

    parts = []
    for dist, values in (("lr", [2.0, 4.0, 3.0]), ("lr+isotropic", [10.0, 14.0, 9.0]), ("t", [1.0, 3.0, 2.0])):
        frame = pd.DataFrame({"distribution": dist, "kind": "low_rank" if dist != "t" else "student_t", "dim": 64,
                              "scheme": "KQV", "budget": 4, "sharpness": 1.0, "trial": range(3), "kl": values})
        parts.append(tmp_path / f"{dist}.parquet")
        frame.to_parquet(parts[-1])
    slice_ = {"parents": {"lr": {"rank": 4, "noise": 0.0}}, "variants": {"lr+isotropic": {"of": "lr",
                                                                                          "query": "isotropic"}},
              "references": ["t"], "scheme": "KQV", "budget": 4, "sharpness": 1.0, "n_boot": 100, "base_seed": 3}
    trials, table = tmp_path / "trials.parquet", tmp_path / "query_model.parquet"
    args = ["stage", "gather", "--trials", *map(str, parts), "--out-trials", str(trials)]
    assert main([*args, "--out-query-model", str(table)]) == 2  # without its slice: refused
    assert "query-model table needs" in capsys.readouterr().err
    assert main([*args, "--out-query-model", str(table), "--query-model-slice", json.dumps(slice_)]) == 0
    written = pd.read_parquet(table)
    assert tuple(written.columns) == ARTIFACTS["query_model"].columns()
    pd.testing.assert_frame_equal(written, query_model_points(pd.read_parquet(trials), **slice_))
    assert list(written["query"]) == ["isotropic", "subspace"]  # by alignment: E[a] = 1, then d / r = 16
    del slice_["references"]
    assert main([*args, "--out-query-model", str(table), "--query-model-slice", json.dumps(slice_)]) == 2
    assert "lacks key(s) references" in capsys.readouterr().err


@pytest.mark.parametrize("stage, outputs", [("card", "OUTPUTS"), ("e2e_stats", "OUTPUTS"),
                                            ("e2e_stats", "OPTIONAL_OUTPUTS")])
def test_a_stages_output_flags_are_the_ones_its_rule_passes(stage, outputs):
    """The rules pass each declared output as --out-<name, underscores as dashes> (the wiring's
    stage_params); the stage's parser must take exactly that flag (the card's allocation_tied was
    declared as --out-allocation_tied, and every card job failed until the tiny DAG ran)."""
    from kvasym.cli import build_parser

    sub = build_parser(stage)._subparsers._group_actions[0].choices["stage"]
    parser = sub._subparsers._group_actions[0].choices[stage]
    flags = {option for action in parser._actions for option in action.option_strings}
    for name in getattr(stage_module(stage), outputs):
        assert f"--out-{name.replace('_', '-')}" in flags, (stage, name)
    rules = _rules()
    body = rules["card" if stage == "card" else "e2e_stats"]
    assert "stage_params(" in body  # the flags derived from the stage's parser (kvasym.wiring)


def test_a_modules_code_is_its_parse_tree_without_docstrings():
    """Issue 48, point 3: comments, docstrings and layout are not code (kvasym.stages.normalized_code);
    a changed statement, constant or name is."""
    from kvasym.stages import normalized_code

    base = b'"""Module."""\nX = 1\n\n\ndef f(a):\n    """Doc."""\n    return a + X  # why\n'
    same = [b'"""Reworded module docstring."""\nX = 1\n\ndef f(a):\n    return a + X\n',
            b'X = 1\n\n\ndef f(a):\n    """Other doc."""\n\n    # a comment\n    return (a + X)\n']
    other = [b'"""Module."""\nX = 2\n\n\ndef f(a):\n    return a + X\n',
             b'"""Module."""\nX = 1\n\n\ndef f(a):\n    return a - X\n',
             b'"""Module."""\nX = 1\n\n\ndef f(b):\n    return b + X\n',
             b'"""Module."""\nX = 1\n\n\ndef f(a):\n    "Doc."\n    return "Doc."\n']
    assert all(normalized_code(s) == normalized_code(base) for s in same)
    assert all(normalized_code(s) != normalized_code(base) for s in other)
    # a string that is not the first statement of a body is code
    assert normalized_code(b'def f():\n    x = 1\n    "kept"\n') != normalized_code(b'def f():\n    x = 1\n')


def test_the_code_digest_cache_is_keyed_by_content_and_survives_damage(tmp_path, monkeypatch):
    import hashlib

    from kvasym import stages

    monkeypatch.setenv("KVASYM_CACHE_DIR", str(tmp_path / "cache"))
    module = tmp_path / "m.py"
    module.write_text('"""Doc."""\nX = 1\n')
    stages.code_digest.cache_clear()
    stages._file_bytes.cache_clear()
    first = stages.code_digest(module)
    assert first == hashlib.sha256(stages.normalized_code(module.read_bytes()).encode()).hexdigest()
    (entry,) = (tmp_path / "cache" / "code").iterdir()
    assert entry.name == hashlib.sha256(module.read_bytes()).hexdigest() and entry.read_text() == first
    entry.write_text("not a digest")  # a damaged entry is computed again, not trusted
    stages.code_digest.cache_clear()
    assert stages.code_digest(module) == first
    monkeypatch.setenv("KVASYM_CACHE_DIR", str(module))  # a cache under a file: unwritable, still a digest
    stages.code_digest.cache_clear()
    assert stages.code_digest(module) == first
    stages.code_digest.cache_clear()
    stages._file_bytes.cache_clear()


def test_a_further_models_and_a_longer_windows_jobs_ask_for_what_they_were_measured_to_need():
    """Gemma 3 270M's long-study jobs peaked above the primary model's requests (4K windows 11.6 GB
    against 8 GB, the card 5.5 against 3, its calibration 3.9 against 3): their model's requests
    cover those peaks; a window longer than 4K asks for proportionally more memory, a shorter one
    for the model's end-to-end request plus its share of the rest; the primary
    model's jobs, and a job without its slice, keep the fixed requests."""
    from kvasym.resources import MODEL_RESOURCES

    measured_peak_mb = {"e2e_long": 11620, "card": 5516, "sensitivity": 3860}
    for stage, peak in measured_peak_mb.items():
        request = job_resources(stage, {"model": "gemma3-270m", "length": 4096})
        assert request["mem_mb"] >= peak * 1.25 and request == dict(zip(("mem_mb", "runtime"),
                                                                        MODEL_RESOURCES["gemma3-270m"][stage]))
    assert job_resources("e2e_long", {"length": 4096}) == job_resources("e2e_long")
    assert job_resources("e2e_long", {"length": 8192})["mem_mb"] == 2 * FIXED_RESOURCES["e2e_long"][0]
    assert job_resources("e2e_long", {"model": "gemma3-270m", "length": 8192})["mem_mb"] == 32000
    # a shorter window: the model's end-to-end request (5 GB) plus the length's share of the rest
    assert job_resources("e2e_long", {"model": "gemma3-270m", "length": 1024})["mem_mb"] == 5000 + 11000 // 4
    assert job_resources("e2e_long", {"model": "gemma3-270m", "length": 64})["mem_mb"] == 5000 + -(-11000 * 64 // 4096)
    assert job_resources("e2e_long", {"length": 1024})["mem_mb"] == 5000 + 3000 // 4
    assert job_resources("passkey", {"model": "gemma3-270m"}) == job_resources("passkey")  # 2.2 GB < 3


def test_part_cells_reads_each_stats_part_from_its_place_in_the_layout():
    """kvasym.cells.part_cells, which the DAG's gather flags (Wiring.part_cells) and a hand run of
    stage gather (--config) share: each part's cell from its path (relative or absolute), the
    digest of its writer's slice, and a path outside the layout refused naming the flag."""
    from kvasym.cells import part_cells, slice_digest
    from kvasym.errors import KvasymError

    calls = []

    def job_slice(stage, cell):
        calls.append((stage, cell))
        return {"stage": stage, **cell}

    parts = ["results/stats/comparisons/gaussian/d128.parquet", "/abs/run/results/stats/comparisons/t1.05/d64.parquet"]
    cells = part_cells("comparisons_part", parts, job_slice)
    assert cells == [
        {"distribution": "gaussian", "dim": 128,
         "slice_sha256": slice_digest({"stage": "stats", "distribution": "gaussian", "dim": 128})},
        {"distribution": "t1.05", "dim": 64,
         "slice_sha256": slice_digest({"stage": "stats", "distribution": "t1.05", "dim": 64})},
    ]
    assert [stage for stage, _ in calls] == ["stats", "stats"]
    with pytest.raises(KvasymError, match=r"elsewhere/d128\.parquet: not a part of the results layout .*give --x"):
        part_cells("comparisons_part", ["elsewhere/d128.parquet"], job_slice, flag="--x")
