"""The catalogue of DAG files (kvasym.artifacts): complete, consistent, and the only place a path is spelled."""

from __future__ import annotations

import argparse
import ast
import re
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvasym import artifacts
from kvasym.artifacts import ARTIFACTS, DAG_FOLDER, JOB_KEYS, WHEN, add_input_arguments, input_flags, template_regex
from kvasym.stages import STAGES, intermediate_inputs

ROOT = Path(__file__).resolve().parent.parent


def test_every_artifact_names_known_stages_and_parts():
    for name, item in ARTIFACTS.items():
        assert item.name == name
        assert item.writers and set(item.writers) <= set(STAGES), name
        assert item.when in WHEN, name
        # the RO-Crate's metadata file stands at the crate's root, the checkout: the one file the DAG
        # writes outside results/ and paper/, where the RO-Crate specification puts it
        assert item.template.startswith((DAG_FOLDER + "/", "paper/")) or item.template == "ro-crate-metadata.json", name
    assert set(JOB_KEYS) == set(STAGES)
    for item in ARTIFACTS.values():
        last = item.template.rsplit("/", 1)[-1]
        if item.folder:  # written whole, its files catalogued under it
            assert "." not in last and any(other.template.startswith(item.template + "/")
                                           for other in ARTIFACTS.values()), item.name
        else:
            assert "." in last, item.name


def test_declared_schemas_resolve_to_the_modules_columns():
    from kvasym.dataset import PER_KEY_SCHEMA, PER_QUERY_SCHEMA

    assert ARTIFACTS["per_query"].columns() == tuple(PER_QUERY_SCHEMA.names)
    assert ARTIFACTS["per_key"].columns() == tuple(PER_KEY_SCHEMA.names)
    for item in ARTIFACTS.values():
        columns = item.columns()
        assert columns is None or (len(columns) > 0 and all(isinstance(c, str) for c in columns)), item.name


_NAME = st.from_regex(r"[A-Za-z0-9_.+-]{1,12}", fullmatch=True)


@given(distribution=_NAME, scheme=_NAME, text=_NAME, name=_NAME, family=_NAME, model=_NAME, stem=_NAME,
       dim=st.integers(1, 4096), budget=st.integers(1, 8), length=st.integers(2, 8192), part=st.integers(0, 63))
def test_a_path_filled_in_is_matched_back_to_its_wildcards(distribution, scheme, text, name, family, model, stem, dim,
                                                            budget, length, part):
    values = {"distribution": distribution, "scheme": scheme, "text": text, "name": name, "format": "pdf",
              "dim": dim, "budget": budget, "length": length, "model": model, "stem": stem, "part": part}
    for key, item in ARTIFACTS.items():
        filled = artifacts.path(key, **values)
        match = template_regex(key).fullmatch(filled)
        assert match is not None, (key, filled)
        assert match.groupdict() == {w: str(values[w]) for w in item.wildcards}
    # a rule per figure family fixes its family; the rest of a job key stays a wildcard
    assert artifacts.log_path("figure", family=family) == f"{DAG_FOLDER}/logs/figures/{family}.log"
    assert artifacts.benchmark_path("stats") == f"{DAG_FOLDER}/benchmarks/stats/{{distribution}}/d{{dim}}.tsv"


def test_a_missing_wildcard_or_an_unknown_artifact_is_named():
    with pytest.raises(KeyError, match=r"per_query: no value for wildcard\(s\) \['scheme', 'budget'\]"):
        artifacts.path("per_query", distribution="gaussian", dim=64)
    with pytest.raises(KeyError, match="no artifact 'per_quer' in the catalogue"):
        artifacts.pattern("per_quer")
    with pytest.raises(KeyError, match="has no wildcard 'text'"):
        artifacts.log_path("stats", text="x")


def test_input_arguments_come_from_the_catalogue_and_are_the_stages_intermediates(tmp_path):
    parser = argparse.ArgumentParser()
    add_input_arguments(parser, {"summary": "summary", "real_per_query": "per_query"},
                        required=("summary",), many=("real_per_query",))
    help_text = parser.format_help()
    assert "results/stats/summary.parquet (stage gather)" in help_text
    assert "--real-per-query" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args([])  # --summary is required
    args = parser.parse_args(["--summary", "s.parquet", "--real-per-query", "a.parquet", "b.parquet"])
    assert args.real_per_query == ["a.parquet", "b.parquet"]
    with pytest.raises(KeyError, match=r"\['nope'\] are not among the inputs"):
        add_input_arguments(argparse.ArgumentParser(), {"summary": "summary"}, required=("nope",))
    # a stage's declared inputs (its module's INPUTS) are the files it may move aside when damaged
    from kvasym.cli import build_parser

    args = build_parser("claims").parse_args(
        ["stage", "claims", "--claims", "c.yaml", "--comparisons", "c.parquet", "--summary", "s.parquet",
         "--trials", "t.parquet", "--theory", "th.parquet", "--e2e-comparisons", "e.parquet",
         "--json", "o.json", "--md", "o.md", "--tex", "o.tex"])
    names = {p.name for p in intermediate_inputs(args)}
    assert names == {"c.parquet", "s.parquet", "t.parquet", "th.parquet", "e.parquet"}


def test_input_flags_quote_each_path():
    assert input_flags({"data_manifests": ["a b.json", "c.json"], "summary": "s.parquet", "captures": []}) == (
        "--data-manifests 'a b.json' c.json --summary s.parquet")


def test_every_stage_input_is_a_catalogued_artifact():
    from kvasym.render.figures.registry import FIGURE_FAMILIES, FIGURE_INPUTS
    from kvasym.stages import stage_module, tables

    declared = [getattr(stage_module(name), "INPUTS", None) for name in STAGES]
    assert sum(inputs is not None for inputs in declared) >= 11
    for inputs in [*filter(None, declared), FIGURE_INPUTS]:
        assert set(inputs.values()) <= set(ARTIFACTS)
    for family in FIGURE_FAMILIES.values():
        assert set(family.inputs) <= set(FIGURE_INPUTS)
    from kvasym.render.tables import (CARD_INPUT_KEYS, E2E_INPUT_KEYS, FRONTIER_INPUT_KEYS, INPUT_KEYS,
                                      MODEL_INPUT_KEYS, PER_MODEL_INPUT_KEYS, REAL_INPUT_KEYS, SEQ_LEN_INPUT_KEYS)

    # the published bands are a config file given beside the artifacts (--published-bands)
    assert set(tables.INPUTS) == {*INPUT_KEYS, *REAL_INPUT_KEYS, *E2E_INPUT_KEYS, *FRONTIER_INPUT_KEYS,
                                  *SEQ_LEN_INPUT_KEYS, *MODEL_INPUT_KEYS, *CARD_INPUT_KEYS,
                                  *PER_MODEL_INPUT_KEYS} - {"published_bands"}


def _fragment(template: str) -> str:
    """The longest fixed part of a template, without the results folder: what spelling it out
    elsewhere would have to repeat."""
    fixed = max((literal for literal, *_ in string.Formatter().parse(template)), key=len)
    return fixed.lstrip("/").removeprefix(DAG_FOLDER + "/")


def _spelling(name: str) -> re.Pattern[str]:
    """A literal that spells artifact ``name``'s path: its fixed part at the start of the string,
    after the results folder, or after a slash that follows a folder variable (a Python
    f-string's piece ``/stats/summary.parquet``, a rule's ``f"{RESULTS}/stats/summary.parquet"``)."""
    return re.compile(rf"(^/?|{DAG_FOLDER}/|\}}/){re.escape(_fragment(ARTIFACTS[name].template))}")


def _code_strings(path: Path):
    """(line, text) of the string literals of a Python file, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def _rule_strings(path: Path):
    """(line, text) of the double-quoted strings of a Snakemake file, comments left out."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in re.finditer(r'"([^"]*)"', line.split("#", 1)[0]):
            yield number, match[1]


def test_a_dag_path_is_spelled_only_in_the_catalogue():
    sources = [(p, _code_strings) for p in sorted((ROOT / "src" / "kvasym").rglob("*.py"))
               if p.name != "artifacts.py"]
    # the checking tools (tools/, outside the library) read the DAG's files through the catalogue too
    sources += [(p, _code_strings) for p in sorted((ROOT / "tools").rglob("*.py"))]
    sources += [(p, _rule_strings) for p in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]]
    strings = [(path, line, text) for path, read in sources for line, text in read(path)]
    spelled = [f"{path.relative_to(ROOT)}:{line}: {name} ({text!r})"
               for name in ARTIFACTS for path, line, text in strings if _spelling(name).search(text)]
    assert not spelled, "paths spelled outside kvasym.artifacts:\n" + "\n".join(spelled)


def test_the_check_above_finds_a_spelled_path(tmp_path):
    """The scan is not vacuous: a literal path in code is found, a docstring mention is not."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Reads results/stats/summary.parquet."""\nPATH = "results/stats/summary.parquet"\n'
                      'OTHER = f"{ROOT}/stats/summary.parquet"\nNOT_IT = "../report/stats/summary.parquet"\n')
    fragment = _spelling("summary")
    assert [line for line, text in _code_strings(sample) if fragment.search(text)] == [2, 3]
    rule = tmp_path / "sample.smk"
    rule.write_text('rule x:\n    output:\n'
                    '        f"{RESULTS}/stats/summary.parquet",  # "results/stats/summary.parquet"\n')
    assert [line for line, text in _rule_strings(rule) if fragment.search(text)] == [3]
