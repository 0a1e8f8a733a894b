"""One home per stage: a rule's name is its stage's name, its module's name and its
``kvasym stage`` subcommand, and every rule calls its stage the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvasym.cli import main
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
    assert {"data", "quantize", "metrics", "stats", "theory", "gather", "claims", "tables", "numbers", "paper",
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
    assert 'code=STAGE_CODE["figure"]' in (ROOT / "workflow/rules/figures.smk").read_text()
    assert "kvasym/metrics.py" in _modules("metrics") and "kvasym/cache.py" in _modules("quantize")
    assert "kvasym/figures.py" in _modules("figure") and "kvasym/figures.py" not in _modules("metrics")
    assert "kvasym/templates/table_results.tex.j2" in _modules("tables")
    assert not any("templates" in m or m.startswith("kvasym/render") for m in _modules("metrics"))
    assert "kvasym/render/claims.py" in _modules("claims") and "kvasym/stats.py" in _modules("stats")
    # lazy imports inside functions count: the figure stage imports kvasym.figures inside run_figures
    assert {"kvasym/stages/figure.py", "kvasym/theory.py"} <= _modules("figure")
    digests = {name: stage_code_digest(name) for name in STAGES}
    assert len(set(digests.values())) == len(digests)  # each stage runs its own code
    assert all(len(d) == 64 for d in digests.values())


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
    assert "kvasym.cache" in stages._imports(package / "stages" / "quantize.py", "kvasym.stages.quantize")


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


def test_the_data_stage_stores_the_trials_its_consumers_read_and_check(small_data, tmp_path, capsys):
    """Issue 19, item 3: the trials of a (distribution, dim) are drawn once, by the data stage,
    and read by its 24 quantize and metrics jobs instead of drawn again by each; every trial read
    is checked against the manifest's digest. A damaged trials file (edited, truncated, of another
    shape) is a DamagedFile, which the stage moves aside so that the data rule rebuilds it."""
    import numpy as np

    from kvasym.errors import DamagedFile, KvasymError
    from kvasym.manifest import load_manifest, regenerate_trial, stored_trials, trials_path
    from kvasym.study import canonical_json

    study, slice_, manifest = small_data
    trials = trials_path(manifest)
    assert trials == manifest.with_name("d64.trials.npy") and trials.is_file()
    digests = load_manifest(manifest, slice_)
    read = stored_trials(slice_, trials, digests)
    for trial in range(2):
        stored, drawn = read(trial), regenerate_trial(slice_, trial)
        for part in ("keys", "values", "queries"):
            assert np.array_equal(getattr(stored, part), getattr(drawn, part))
            assert getattr(stored, part).flags.writeable  # a fresh array, not a view of the file
    raw = trials.read_bytes()
    flipped = bytearray(raw)
    flipped[-1] ^= 1  # the last query of the last trial
    trials.write_bytes(bytes(flipped))
    read = stored_trials(slice_, trials, digests)
    read(0)
    with pytest.raises(DamagedFile, match=r"stored trial 1 of gaussian d=64 differs from its manifest digest"):
        read(1)
    trials.write_bytes(raw[:-8])
    with pytest.raises(DamagedFile, match="unreadable stored trials"):
        stored_trials(slice_, trials, digests)
    trials.write_bytes(raw)
    with pytest.raises(DamagedFile, match=r"not float64 \(2, 69, 64\)"):
        stored_trials({**slice_, "n_queries": 5}, trials, digests)
    # what the rule runs: exit 2, one line, the trials moved aside and the manifest left alone
    trials.write_bytes(bytes(flipped))
    code = main(["stage", "quantize", "--slice", canonical_json(study.cell_slice("gaussian", 64, "KQV", 4)),
                 "--data", str(manifest), "--trials", str(trials), "--out", str(tmp_path / "p.npz")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "differs from its manifest digest" in last and "Traceback" not in last, last
    assert last.endswith("moved aside to .d64.trials.npy.damaged; rerun and the rule that writes it rebuilds it")
    assert not trials.exists() and trials.with_name(".d64.trials.npy.damaged").is_file() and manifest.is_file()
    assert not (tmp_path / "p.npz").exists()
    with pytest.raises(KvasymError, match="no such stored trials file"):
        stored_trials(slice_, trials, digests)


def test_quantize_and_metrics_jobs_import_only_what_they_use(small_data, tmp_path):
    """Issue 19, item 3: a quantize or metrics job imported pandas (pyarrow's ``pa.array``
    imports it on every call), jsonschema and the config schema (``kvasym.study``, for a JSON
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
              "'kvasym.real.capture')\nprint(code, sorted(m for m in heavy if m in sys.modules))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                      if p)}
    packed = tmp_path / "p.npz"
    jobs = {
        "quantize": ["--slice", canonical_json(study.cell_slice("gaussian", 64, "KQV", 4)), "--data", str(manifest),
                     "--out", str(packed)],
        "metrics": ["--slice", canonical_json(study.metrics_slice("gaussian", 64, "KQV", 4)), "--data", str(manifest),
                    "--packed", str(packed), "--per-query", str(tmp_path / "pq.parquet"),
                    "--per-key", str(tmp_path / "pk.parquet")],
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

    table = pq.read_table(tmp_path / "pq.parquet")
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
