"""The run's RO-Crate (kvasym.render.crate): valid JSON-LD under the RO-Crate context, every file
with its true SHA-256, each job's files and each claim's sources as the catalogue says.

The JSON-LD check expands the crate with pyld against the RO-Crate context that the ``rocrate``
package ships (read offline): a term the context does not define is dropped by expansion, so the
test compares every entity's properties before and after, and every type must expand to an
absolute IRI. The crate is then read by ``rocrate`` itself, as RO-Crate tools read one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from kvasym.errors import KvasymError
from kvasym.render.crate import CONTEXT, METADATA_FILE, build_crate, collect_files, match_artifact, write_crate

rocrate = pytest.importorskip("rocrate.rocrate")
jsonld = pytest.importorskip("pyld.jsonld")


@functools.lru_cache(maxsize=1)
def _context_document() -> dict:
    import rocrate as package

    return json.loads((Path(package.__file__).parent / "data" / "ro-crate.jsonld").read_text())


def _offline_loader(url: str, options: dict | None = None) -> dict:
    """pyld's document loader: the RO-Crate context from the rocrate package; anything else fails."""
    if url.rstrip("/") != CONTEXT:
        raise AssertionError(f"the crate asks for a context other than RO-Crate's: {url}")
    return {"contextUrl": None, "documentUrl": url, "document": _context_document()}


def check_crate(root: Path) -> dict:
    """Every check a valid crate passes; returns the document, its entities by id."""
    document = json.loads((root / METADATA_FILE).read_text())
    assert document["@context"] == CONTEXT
    # the shipped context is the one the crate names
    assert _context_document()["@id"] == CONTEXT
    graph = {e["@id"]: e for e in document["@graph"]}
    assert len(graph) == len(document["@graph"]), "an @id is used twice"
    # RO-Crate's metadata descriptor and root dataset
    assert graph[METADATA_FILE]["about"] == {"@id": "./"}
    assert graph[METADATA_FILE]["conformsTo"]["@id"].startswith("https://w3id.org/ro/crate/")
    root_entity = graph["./"]
    assert root_entity["@type"] == "Dataset"
    for required in ("name", "description", "datePublished", "license"):
        assert root_entity.get(required), f"the root dataset has no {required}"
    # expansion under the context keeps every property and gives every type an absolute IRI
    options = {"documentLoader": _offline_loader}
    for entity in document["@graph"]:
        (node,) = jsonld.expand({"@context": document["@context"], **entity}, options)
        kept = {k for k in node if not k.startswith("@")}
        assert len(kept) == len([k for k in entity if not k.startswith("@")]), (
            f"{entity['@id']}: a property is not a term of the RO-Crate context "
            f"({sorted(k for k in entity if not k.startswith('@'))} -> {sorted(kept)})")
        for t in node.get("@type", []):
            assert t.startswith(("http://", "https://")), f"{entity['@id']}: type {t} is not in the context"
    # every reference names an entity of the crate or an absolute IRI
    def references(value):
        if isinstance(value, dict):
            if set(value) == {"@id"}:
                yield value["@id"]
            else:
                for v in value.values():
                    yield from references(v)
        elif isinstance(value, list):
            for v in value:
                yield from references(v)

    for entity in document["@graph"]:
        for ref in references({k: v for k, v in entity.items() if k != "@id"}):
            assert ref in graph or ref.startswith(("http://", "https://")), f"{entity['@id']} -> {ref}: dangling"
    # every File is there with its true size and SHA-256, and listed by the root
    parts = {p["@id"] for p in root_entity["hasPart"]}
    for entity in document["@graph"]:
        if entity["@type"] == "File":
            data = (root / entity["@id"]).read_bytes()
            assert entity["sha256"] == hashlib.sha256(data).hexdigest(), entity["@id"]
            assert int(entity["contentSize"]) == len(data)
            assert entity["@id"] in parts
    # an RO-Crate reader finds the workflow and the claims
    crate = rocrate.ROCrate(root)
    assert crate.mainEntity.id == "Snakefile"
    assert crate.root_dataset["mainEntity"].id == "Snakefile"
    return graph


def _write(root: Path, rel: str, text: str) -> str:
    """Write ``text`` at ``rel``: as a one-cell Parquet table for a .parquet name (the crate
    refuses a file that is not whole of its format, kvasym.render.crate.check_complete)."""
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame({"text": [text]}).to_parquet(p, index=False)
    else:
        p.write_text(text)
    return rel


@pytest.fixture
def small_run(tmp_path: Path) -> tuple[Path, dict]:
    """A folder laid out as a run: two synthetic units, one real one, their stats parts, the
    gathered table and a ledger of two claims (one decided in gaussian d64, one over all cells)."""
    for rel in ("Snakefile", "config/c.yaml", "config/claims.yaml"):
        _write(tmp_path, rel, f"content of {rel}\n")
    files = {}
    for dist in ("gaussian", "t3"):
        files[f"pq_{dist}"] = _write(tmp_path, f"results/metrics/per_query/{dist}/d64/KV/n2.parquet", f"pq {dist}")
        files[f"part_{dist}"] = _write(tmp_path, f"results/stats/comparisons/{dist}/d64.parquet", f"part {dist}")
        files[f"trials_{dist}"] = _write(tmp_path, f"results/stats/trials/{dist}/d64.parquet", f"trials {dist}")
        files[f"data_{dist}"] = _write(tmp_path, f"results/data/{dist}/d64.json", f"{{\"{dist}\": 1}}")
    files["pq_real"] = _write(tmp_path, "results/metrics/per_query/smollm2/d64/KV/n2.parquet", "pq real")
    files["gathered"] = _write(tmp_path, "results/stats/comparisons.parquet", "gathered")
    files["trials"] = _write(tmp_path, "results/stats/trials.parquet", "gathered trials")
    files["ledger"] = _write(tmp_path, "results/claims/claims.json", "[]")
    ledger = [
        {"id": "C2r", "statistic": "kl_ratio", "statement": "KQV beats QKQV", "estimate": 2.25, "low": 2.0,
         "high": 2.5, "log10_p": float("-inf"), "verdict": "holds", "where": {"distribution": "gaussian", "dim": 64}},
        {"id": "C5", "statistic": "distribution_ratio", "statement": "low rank vs heavy tails", "estimate": 3.0,
         "verdict": "holds", "where": {"num": "gaussian", "den": "t3", "dim": 64, "budget": 4,
                                       "distribution": "lowrank8"}},
        {"id": "C3", "statistic": "cells_better", "statement": "everywhere", "estimate": 12, "verdict": "holds",
         "where": {"budgets": [2, 3], "distributions": ["gaussian", "t3"], "distribution": "gaussian", "dim": 64}},
    ]
    writers = {"gaussian": "cells", "t3": "cells", "smollm2": "real_metrics"}
    crate = build_crate(tmp_path, collect_files(tmp_path, ["results"]), ledger=ledger, unit_writers=writers,
                        inputs={"config": "config/c.yaml", "claims_file": "config/claims.yaml"},
                        config_sha256="ab" * 32, commit="0" * 40, clean=True,
                        packages=[{"name": "Python", "version": "3.11.7"}, {"name": "numpy", "version": "2.4.6"}])
    write_crate(crate, tmp_path / METADATA_FILE)
    return tmp_path, files


def test_small_run_crate_is_valid_and_links_each_claim_to_its_sources(small_run) -> None:
    root, files = small_run
    graph = check_crate(root)
    # the claim decided in gaussian d64 reads the gathered table and gaussian's part, not t3's
    based = {r["@id"] for r in graph["#claim-C2r"]["isBasedOn"]}
    assert based == {files["gathered"], files["part_gaussian"]}
    values = {graph[v["@id"]]["name"]: graph[v["@id"]]["value"] for v in graph["#claim-C2r"]["additionalProperty"]}
    # a p that underflowed (log10 p = -inf, as the ledger's JSON has it) is spelled as JSON readers do
    assert values == {"estimate": 2.25, "low": 2.0, "high": 2.5, "log10_p": "-Infinity", "verdict": "holds",
                      "statistic": "kl_ratio"}
    # a ratio of two distributions reads the trials table and both cells' parts of it, no comparisons
    # (and not the headline distribution the ledger fills into every where)
    assert {r["@id"] for r in graph["#claim-C5"]["isBasedOn"]} == {files["trials"], files["trials_gaussian"],
                                                                   files["trials_t3"]}
    # a claim over many cells (named by `distributions`) reads the gathered table only
    assert {r["@id"] for r in graph["#claim-C3"]["isBasedOn"]} == {files["gathered"]}
    # one action per job: the stats job of gaussian d64 read gaussian's metrics and wrote its part
    job = graph["#job-stats/gaussian/d64"]
    assert {r["@id"] for r in job["result"]} == {files["part_gaussian"], files["trials_gaussian"]}
    assert {r["@id"] for r in job["object"]} == {files["pq_gaussian"], "config/c.yaml", "config/claims.yaml"}
    assert job["instrument"] == {"@id": "#stage-stats"}
    # a file of several writers goes to the one the distribution names
    assert {r["@id"] for r in graph["#job-cells/gaussian/d64"]["result"]} == {files["pq_gaussian"],
                                                                              files["data_gaussian"]}
    assert {r["@id"] for r in graph["#job-real/metrics/smollm2/d64/KV"]["result"]} == {files["pq_real"]}
    # the run: its inputs with their hashes, the commit, every file and claim as its result
    run = graph["#run"]
    assert {r["@id"] for r in run["object"]} == {"config/c.yaml", "config/claims.yaml"}
    assert graph["config/c.yaml"]["sha256"] == hashlib.sha256(b"content of config/c.yaml\n").hexdigest()
    assert graph["Snakefile"]["version"] == "0" * 40
    assert {"#claim-C2r", "#claim-C3", files["ledger"]} <= {r["@id"] for r in run["result"]}
    assert graph[files["pq_real"]]["exampleOfWork"] == {"@id": "#artifact-per_query"}


def test_tampered_file_fails_the_check(small_run) -> None:
    root, files = small_run
    (root / files["part_t3"]).write_text("changed after the crate was written")
    with pytest.raises(AssertionError, match="d64.parquet"):
        check_crate(root)


def test_undefined_term_fails_the_check(small_run) -> None:
    """The JSON-LD check catches a property the context does not define (it would be dropped)."""
    root, _ = small_run
    path = root / METADATA_FILE
    document = json.loads(path.read_text())
    document["@graph"][-1]["kvasymVerdict"] = "holds"
    path.write_text(json.dumps(document))
    with pytest.raises(AssertionError, match="not a term of the RO-Crate context"):
        check_crate(root)


def test_match_artifact_and_missing_target(tmp_path: Path) -> None:
    assert match_artifact("results/stats/trials/t3/d128.parquet") == ("trials_part",
                                                                      {"distribution": "t3", "dim": "128"})
    assert match_artifact("results/notes.txt") is None
    with pytest.raises(KvasymError, match="results/absent.parquet"):
        collect_files(tmp_path, ["results/absent.parquet"])


def test_stage_refuses_a_missing_output_in_one_line(tmp_path: Path) -> None:
    _write(tmp_path, "results/claims/claims.json", "[]")
    _write(tmp_path, "config/claims.yaml", "x")
    slice_ = json.dumps({"inputs": {"claims_file": "config/claims.yaml"}, "config_sha256": "0", "unit_writers": {}})
    done = subprocess.run(["kvasym", "stage", "crate", "--slice", slice_, "--claims", "results/claims/claims.json",
                           "--files", "results/nothing", "--out", METADATA_FILE], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ})
    assert done.returncode != 0
    assert "results/nothing" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / METADATA_FILE).exists()


@pytest.mark.slow
def test_tiny_run_crate(tiny_local_run: Path) -> None:
    """The DAG's crate of the tiny run: valid, every claim of the ledger in it, every output listed."""
    graph = check_crate(tiny_local_run)
    ledger = json.loads((tiny_local_run / "results/claims/claims.json").read_text())
    for row in ledger:
        claim = graph[f"#claim-{row['id']}"]
        assert claim["isBasedOn"], f"claim {row['id']} is linked to no file"
        where = row.get("where") or {}
        if "num" in where:  # a ratio's parts are its two distributions' only
            # the per-cell parts (stats and theory alike), by the catalogue's reading of their paths
            cells = [match_artifact(r["@id"]) for r in claim["isBasedOn"]]
            parts = [values["distribution"] for _, values in filter(None, cells) if "distribution" in values]
            assert set(parts) <= {where["num"], where["den"]}, (row["id"], parts)
            assert parts or row["verdict"] == "not evaluated", row["id"]
    listed = {e["@id"] for e in graph.values() if e["@type"] == "File"}
    assert "results/stats/comparisons.parquet" in listed and "paper/generated/claims.tex" in listed
    # every job that wrote a file is an action, the end-to-end passes' per-text jobs included
    assert any(i.startswith("#job-real/e2e/") for i in graph) and "#jobs-figure" in graph
    per_query = {p.relative_to(tiny_local_run).as_posix()
                 for p in (tiny_local_run / "results/metrics/per_query").rglob("*.parquet")}
    assert per_query <= listed
