"""Provenance a machine can read: the run as a Workflow Run RO-Crate (``ro-crate-metadata.json``).

The crate's root is the checkout the DAG ran in (``./``): the workflow (``Snakefile``, the
crate's ``mainEntity``), the config and claims files it read and every file the run wrote are
data entities inside it. The metadata is written from the catalogue (:mod:`kvasym.artifacts`),
never from guesses about file names:

- each file of the run is a ``File`` with its size and SHA-256, linked (``exampleOfWork``) to the
  ``FormalParameter`` of its artifact (the catalogue entry: name, description, template);
- each job is a ``CreateAction`` (``#job-<job key>``, the key of its log and benchmark file,
  :data:`kvasym.artifacts.JOB_KEYS`; ``#jobs-<stage>`` for a stage whose job key the files do not
  tell, as the figure families): its ``result`` are the files of its stage's artifacts whose
  wildcards agree with the job's, its ``object`` the files of the artifacts the stage declares as
  inputs (``INPUTS`` of its module) that agree with the job's wildcards, its ``instrument`` the
  stage's code (``#stage-<stage>``, identified by :func:`kvasym.stages.stage_code_digest`);
- each claim of the ledger is a ``Claim`` (``#claim-<id>``) whose ``isBasedOn`` names the
  gathered tables its statistic reads (its record's ``tables``, :data:`kvasym.claims.STATISTICS`) and, when
  the claim is decided at one dim in one distribution (or a ratio's two), those cells' parts of
  them; its estimate, interval, log10 p and verdict are ``additionalProperty`` values, read from
  the ledger, never recomputed;
- the run itself (``#run``) is the ``CreateAction`` of the workflow: ``object`` the config and
  claims files (with their SHA-256, and the SHA-256 of the effective config), ``result`` every
  file and claim; the workflow's ``version`` is the git commit, ``softwareRequirements`` the
  versions of the packages that computed the numbers (:func:`kvasym.render.reproduce.package_versions`).

The crate follows RO-Crate 1.3 and the Workflow Run Crate profile 0.5 (the Process Run Crate's
actions, the Workflow RO-Crate's main entity). Every term is one of the RO-Crate JSON-LD
context's, so a JSON-LD processor expands the crate without dropping any property (checked in
``tests/test_crate.py`` against the context the ``rocrate`` package ships).

References
----------
.. [1] S. Soiland-Reyes et al., "Packaging research artefacts with RO-Crate", Data Science 5(2),
   2022. https://w3id.org/ro/crate
.. [2] S. Leo et al., "Recording provenance of workflow runs with RO-Crate", PLOS ONE 19(9), 2024.
   https://w3id.org/ro/wfrun
"""

from __future__ import annotations

import hashlib
import json
import math
import mimetypes
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..artifacts import ARTIFACTS, JOB_KEYS, pattern, template_regex
from ..errors import KvasymError

__all__ = ["CONTEXT", "METADATA_FILE", "PROFILES", "build_crate", "check_complete", "collect_files", "crate_slice",
           "match_artifact", "read_ledger", "write_crate"]

#: The JSON-LD context and the specification the crate conforms to.
CONTEXT = "https://w3id.org/ro/crate/1.3/context"
SPECIFICATION = "https://w3id.org/ro/crate/1.3"
#: The profiles the root dataset conforms to (Process, Workflow Run Crate; Workflow RO-Crate).
PROFILES = ("https://w3id.org/ro/wfrun/process/0.5", "https://w3id.org/ro/wfrun/workflow/0.5",
            "https://w3id.org/workflowhub/workflow-ro-crate/1.0")
#: The metadata file's name (the RO-Crate specification fixes it) at the crate's root.
METADATA_FILE = pattern("crate")
_SNAKEMAKE = "https://w3id.org/workflowhub/workflow-ro-crate#snakemake"
_COMPLETED = "http://schema.org/CompletedActionStatus"
_FORMATS = {".parquet": "application/vnd.apache.parquet", ".npz": "application/x-npz",
            ".tex": "text/x-tex", ".md": "text/markdown", ".yaml": "application/yaml", ".json": "application/json",
            ".pdf": "application/pdf", ".png": "image/png", ".html": "text/html"}
#: The ledger fields a claim carries as its additionalProperty values.
_CLAIM_VALUES = ("estimate", "low", "high", "log10_p", "paper_value", "verdict", "reason", "statistic")


def _file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _tail(path: Path, size: int, n: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(max(0, size - n))
        return handle.read()


def check_complete(path: str | os.PathLike) -> None:
    """A :class:`~kvasym.errors.DamagedFile` when ``path`` is not a whole file of its format.

    The crate calls every file it lists the result of a completed job; a file cut short or
    emptied after its job ended (jobs write atomically) is refused, naming it, instead of being
    hashed as that result. The checks read a file's ends only (a JSON file is parsed): Parquet
    starts and ends with ``PAR1`` around a footer that fits in the file, an ``.npz`` is a zip
    archive with its central directory, a PNG starts with its signature and ends with its
    ``IEND`` chunk, a PDF starts with ``%PDF-`` and has ``%%EOF`` in its last KiB, a JSON file
    parses. Other formats (text, LaTeX, YAML) have no structure to check.
    """
    import struct
    import zipfile

    from ..errors import DamagedFile

    p = Path(path)
    suffix, size = p.suffix.lower(), p.stat().st_size
    if suffix not in (".parquet", ".npz", ".png", ".pdf", ".json"):
        return
    if size == 0:
        raise DamagedFile(p, f"is empty, not a whole {suffix} file")
    with open(p, "rb") as handle:
        head = handle.read(8)
    if suffix == ".parquet":
        tail = _tail(p, size, 8)
        whole = (size >= 12 and head[:4] == b"PAR1" and tail[4:] == b"PAR1"
                 and struct.unpack("<I", tail[:4])[0] + 12 <= size)
        reason = "not a whole Parquet table (no PAR1 footer that fits in the file)"
    elif suffix == ".npz":
        whole, reason = zipfile.is_zipfile(p), "not a whole .npz archive (no zip central directory)"
    elif suffix == ".png":
        whole = head == b"\x89PNG\r\n\x1a\n" and _tail(p, size, 12)[4:8] == b"IEND"
        reason = "not a whole PNG image (no signature or IEND chunk)"
    elif suffix == ".pdf":
        whole, reason = head[:5] == b"%PDF-" and b"%%EOF" in _tail(p, size, 1024), "not a whole PDF (no %%EOF)"
    else:
        try:
            json.loads(p.read_bytes())
            whole, reason = True, ""
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            whole, reason = False, f"not valid JSON ({exc})"
    if not whole:
        raise DamagedFile(p, reason)


def read_ledger(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The claims ledger at ``path`` (stage ``claims``' ``claims.json``): a JSON list of claims,
    each an object with an ``id`` and, when given, a ``where`` object; anything else is a
    :class:`~kvasym.errors.DamagedFile` naming the file and the first entry that is wrong (a
    ledger ``{}`` gave a crate of no claims, silently; an entry without an id, a traceback)."""
    from ..errors import DamagedFile

    p = Path(path)
    try:
        ledger = json.loads(p.read_bytes())
    except ValueError as exc:
        raise DamagedFile(p, f"not a readable claims ledger (not valid JSON: {exc})") from None
    if not isinstance(ledger, list):
        raise DamagedFile(p, f"not a claims ledger: a JSON {type(ledger).__name__}, not a list of claims")
    for i, row in enumerate(ledger):
        cid = row.get("id") if isinstance(row, dict) else None
        if not isinstance(cid, (str, int)) or isinstance(cid, bool):
            raise DamagedFile(p, f"not a claims ledger: entry {i} is not a claim object with an id ({row!r:.60})")
        if not isinstance(row.get("where") or {}, dict):
            raise DamagedFile(p, f"not a claims ledger: claim {cid!r} (entry {i}) has a 'where' that is not an "
                                 f"object ({row['where']!r:.60})")
    return ledger


def _inside(root: Path, target: str | os.PathLike, what: str) -> tuple[Path, str]:
    """``target`` (relative to ``root``, or absolute) as an absolute path and as a path relative
    to ``root`` with ``/``, both lexical: symbolic links are not resolved, so a results folder
    that is a link to a scratch disk keeps its name in the crate (resolving it gave a
    traceback). A path outside ``root`` is a KvasymError naming it: a crate's files lie inside
    its root."""
    p = Path(os.path.normpath(root / target))
    try:
        return p, p.relative_to(root).as_posix()
    except ValueError:
        raise KvasymError(f"{target}: {what} lies outside the crate's root {root}; a crate lists only files "
                          "inside its root (move or copy it into the checkout)") from None


def match_artifact(relpath: str) -> tuple[str, dict[str, str]] | None:
    """The catalogue artifact whose template ``relpath`` (relative to the crate's root, with
    ``/``) is an instance of, and its wildcard values; None when no file artifact matches."""
    for name, item in ARTIFACTS.items():
        if item.folder:
            continue
        match = template_regex(name).fullmatch(relpath)
        if match:
            return name, match.groupdict()
    return None


def collect_files(root: str | os.PathLike, targets: Iterable[str | os.PathLike]) -> list[str]:
    """The run's files, relative to ``root``: each target file, and every file inside each target
    folder (a ``directory()`` output), hidden names (a job's temporary or moved-aside files) left
    out; sorted, as given (symbolic links are not resolved). A target that does not exist, lies
    outside ``root`` or is neither a file nor a folder (a fifo), and a file in a target folder that
    is a symbolic link to no file, are a :class:`KvasymError` naming it."""
    root = Path(os.path.abspath(root))
    found: set[str] = set()
    for target in targets:
        p, rel = _inside(root, target, "an output of the run")
        if p.is_dir():
            for folder, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in (f for f in files if not f.startswith(".")):
                    f = Path(folder, name)
                    if not f.is_file():
                        raise KvasymError(f"{f}: a symbolic link to no file, or not a regular file, in output "
                                          f"folder {target}")
                    found.add(_inside(root, f, "a file of the run")[1])
        elif p.is_file():
            found.add(rel)
        elif os.path.lexists(p):
            kind = "a symbolic link that leads to no file" if p.is_symlink() else "not a regular file or folder"
            raise KvasymError(f"{target}: {kind} (an output of the run the crate describes)")
        else:
            raise KvasymError(f"{target}: no such file or folder (an output of the run the crate describes)")
    return sorted(found)


def _agrees(values: Mapping[str, str], fixed: Mapping[str, Any]) -> bool:
    return all(str(values[k]) == str(v) for k, v in fixed.items() if k in values)


def _job_wildcards(stage: str) -> tuple[str, ...]:
    from string import Formatter

    return tuple(f for _, f, _, _ in Formatter().parse(JOB_KEYS[stage]) if f)


def _inputs_of(stage: str) -> dict[str, str]:
    """Stage ``stage``'s ``INPUTS``: argument -> the artifact it reads."""
    from ..stages import stage_module

    return dict(getattr(stage_module(stage), "INPUTS", {}))


def _stage_inputs(stage: str) -> tuple[str, ...]:
    """The artifacts stage ``stage`` reads, in catalogue order."""
    declared = set(_inputs_of(stage).values())
    return tuple(name for name in ARTIFACTS if name in declared)


def _id_ref(ids: Iterable[str]) -> list[dict[str, str]]:
    return [{"@id": i} for i in ids]


def _property(name: str, value: Any) -> dict[str, Any]:
    """A PropertyValue; a non-finite number (a log10 p of -inf: p underflowed) is written as the
    text JSON's own readers use for it (``-Infinity``, ``Infinity``, ``NaN``), since JSON has no
    such numbers and the ledger's JSON carries them in that spelling."""
    if isinstance(value, float) and not math.isfinite(value):
        value = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return {"@id": f"#value-{name}", "@type": "PropertyValue", "name": name, "value": value}


def build_crate(root: str | os.PathLike, files: Sequence[str], *, ledger: Sequence[Mapping[str, Any]],
                unit_writers: Mapping[str, str], inputs: Mapping[str, str], config_sha256: str,
                commit: str | None, clean: bool | None, packages: Sequence[Mapping[str, str]],
                end_time: datetime | None = None) -> dict[str, Any]:
    """The crate's JSON-LD document (see the module doc).

    Parameters
    ----------
    root : path
        The crate's root (the checkout the DAG ran in); every path below is relative to it.
    files : sequence of str
        The run's files (:func:`collect_files`), each matched to its artifact.
    ledger : sequence of mapping
        The claims ledger (``results/claims/claims.json``): its entries become ``Claim`` entities.
    unit_writers : mapping
        Distribution name -> the stage that wrote its metrics (``cells`` for the synthetic grid,
        ``metrics`` for a query-model variant, ``real_metrics``, ``file_metrics``): the artifacts
        with several writers are attributed by it.
    inputs : mapping
        What the run read: ``{"config": path, ...}`` for each config file and ``"claims_file"``.
    config_sha256 : str
        SHA-256 of the effective config (canonical JSON, defaults filled in).
    commit, clean : str or None, bool or None
        The git commit of the checkout and whether its tree was clean (None without git).
    packages : sequence of mapping
        ``[{name, version}]`` of the software (:func:`kvasym.render.reproduce.package_versions`).
    end_time : datetime, optional
        When the run ended (default: the newest file's modification time).
    """
    root = Path(os.path.abspath(root))
    entities, instances, mtimes = _data_entities(root, files)
    end = end_time or (datetime.fromtimestamp(max(mtimes), tz=timezone.utc) if mtimes
                       else datetime.now(tz=timezone.utc))
    end_text = end.replace(microsecond=0).isoformat()
    input_ids = []
    for role, rel in inputs.items():  # what the run read: the config files and the claims file
        path, inside = _inside(root, rel, f"the run's {role}")
        if not path.is_file():
            raise KvasymError(f"{rel}: no such file (the run's {role})")
        entity = _file_entity(root, inside, f"#input-{role}")
        entity["description"] = f"the run's {role.replace('_', ' ')}"
        entities[entity["@id"]] = entity
        input_ids.append(entity["@id"])
    parameters = _parameters(instances, inputs)
    actions, stage_entities = _job_actions(instances, unit_writers, input_ids)
    claims = _claim_entities(ledger, instances)
    claim_ids = [c["@id"] for c in claims if c["@type"] == "Claim"]
    for action in actions:  # the claims job wrote the ledger's claims
        if action["instrument"]["@id"] == "#stage-claims":
            action["result"] += _id_ref(claim_ids)
    for rel, _ in instances.get("claims_json", ()):
        entities[rel]["about"] = _id_ref(claim_ids)
    data_ids = sorted(entities)
    software = [{"@id": f"#software-{p['name']}", "@type": "SoftwareApplication", "name": p["name"],
                 "version": p["version"]} for p in packages]
    workflow = _workflow_entity(root, commit, software, inputs, parameters)
    run, run_values = _run_entity(end_text, input_ids, [i for i in data_ids if i not in input_ids] + claim_ids,
                                  config_sha256, clean)
    graph = [
        {"@id": METADATA_FILE, "@type": "CreativeWork", "conformsTo": {"@id": SPECIFICATION}, "about": {"@id": "./"}},
        {"@id": "./", "@type": "Dataset", "name": "kvasym: a run of the KV-cache quantization study",
         "description": "Every number, figure and table of the study as one Snakemake run wrote them, with the "
                        "claims ledger and what each claim was computed from.",
         "datePublished": end_text, "license": {"@id": "https://spdx.org/licenses/MIT"},
         "conformsTo": _id_ref(PROFILES), "mainEntity": {"@id": "Snakefile"},
         "hasPart": _id_ref(["Snakefile", *data_ids]), "mentions": _id_ref(["#run", *(a["@id"] for a in actions)])},
        {"@id": "https://spdx.org/licenses/MIT", "@type": "CreativeWork", "name": "MIT License"},
        workflow, run, *run_values, *actions, *stage_entities, *(entities[i] for i in data_ids), *parameters,
        *claims, *software, *_languages(packages),
    ]
    return {"@context": CONTEXT, "@graph": graph}


def _file_entity(root: Path, rel: str, example_of: str | None) -> dict[str, Any]:
    """A ``File``: size, SHA-256, format, and the formal parameter it is an instance of; a file
    that is not whole (:func:`check_complete`) is refused."""
    p = root / rel
    check_complete(p)
    entity: dict[str, Any] = {"@id": rel, "@type": "File", "name": p.name, "contentSize": str(p.stat().st_size),
                              "sha256": _file_digest(p),
                              "encodingFormat": _FORMATS.get(p.suffix) or mimetypes.guess_type(p.name)[0]
                              or "application/octet-stream"}
    if example_of is not None:
        entity["exampleOfWork"] = {"@id": example_of}
    return entity


#: Each artifact's files in a run: artifact name -> [(path, its wildcard values)].
Instances = dict[str, list[tuple[str, dict[str, str]]]]


def _data_entities(root: Path, files: Sequence[str]) -> tuple[dict[str, dict[str, Any]], Instances, list[float]]:
    """The run's files as entities (by id), each artifact's instances with their wildcard
    values, and the files' modification times."""
    entities: dict[str, dict[str, Any]] = {}
    instances: Instances = {}
    mtimes = []
    for rel in files:
        mtimes.append((root / rel).stat().st_mtime)
        found = match_artifact(rel)
        if found is not None:
            instances.setdefault(found[0], []).append((rel, found[1]))
        entities[rel] = _file_entity(root, rel, None if found is None else f"#artifact-{found[0]}")
    return entities, instances, mtimes


def _parameters(instances: Mapping[str, Any], inputs: Mapping[str, str]) -> list[dict[str, Any]]:
    """The workflow's formal outputs (the artifacts the run has files of) and inputs."""
    profile = {"@id": "https://bioschemas.org/profiles/FormalParameter/1.0-RELEASE"}
    out = [{"@id": f"#artifact-{name}", "@type": "FormalParameter", "name": name,
            "description": f"{ARTIFACTS[name].description} ({ARTIFACTS[name].template})", "additionalType": "File",
            "encodingFormat": _FORMATS.get(Path(ARTIFACTS[name].template).suffix, "application/octet-stream"),
            "conformsTo": profile} for name in ARTIFACTS if name in instances]
    return out + [{"@id": f"#input-{role}", "@type": "FormalParameter", "name": role, "additionalType": "File",
                   "conformsTo": profile} for role in inputs]


def _job_actions(instances: Instances, unit_writers: Mapping[str, str],
                 input_ids: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One action per job (the files its stage writes that agree with the job's wildcards, and
    what its stage reads that agrees with them), and the stages' code entities."""
    from ..stages import STAGES, stage_code_digest

    def writes(stage: str, name: str, values: Mapping[str, str]) -> bool:
        writers = ARTIFACTS[name].writers
        if len(writers) > 1 and "distribution" in values:
            return unit_writers.get(values["distribution"]) == stage
        return stage in writers

    jobs: dict[str, dict[str, Any]] = {}
    for name, items in instances.items():
        for rel, values in items:
            for stage in (s for s in STAGES if writes(s, name, values)):
                fixed = {w: values[w] for w in _job_wildcards(stage) if w in values}
                key = JOB_KEYS[stage]
                for w, v in fixed.items():
                    key = key.replace("{" + w + "}", str(v))
                # a job key whose wildcards the file does not tell (a figure's family): the stage's jobs
                job_id = f"#job-{key}" if "{" not in key else f"#jobs-{stage}"
                jobs.setdefault(job_id, {"stage": stage, "fixed": fixed, "result": []})["result"].append(rel)
    actions, stages_used = [], []
    for job_id in sorted(jobs, key=lambda j: (list(STAGES).index(jobs[j]["stage"]), j)):
        stage, fixed = jobs[job_id]["stage"], jobs[job_id]["fixed"]
        stages_used += [] if stage in stages_used else [stage]
        objects = [rel for name in _stage_inputs(stage) for rel, values in instances.get(name, ())
                   if _agrees(values, fixed)]
        name = f"{stage} {job_id.removeprefix('#job-')}" if job_id.startswith("#job-") else f"{stage} jobs"
        actions.append({"@id": job_id, "@type": "CreateAction", "name": name,
                        "instrument": {"@id": f"#stage-{stage}"}, "actionStatus": {"@id": _COMPLETED},
                        "object": _id_ref([*objects, *input_ids]), "result": _id_ref(sorted(jobs[job_id]["result"]))})
    code = [{"@id": f"#stage-{stage}", "@type": "SoftwareSourceCode", "name": f"kvasym stage {stage}",
             "description": STAGES[stage], "identifier": f"sha256:{stage_code_digest(stage)}",
             "programmingLanguage": {"@id": "#python"}} for stage in stages_used]
    return actions, code


def _claim_cells(where: Mapping[str, Any]) -> list[str]:
    """The distributions a claim is decided in at ``where["dim"]``: a ratio's two, or its one;
    none for a claim over many cells. The ledger fills the headline's distribution into every
    ``where``, so a ratio's ``distribution`` is not its cell."""
    if "dim" not in where:
        return []
    if "num" in where and "den" in where:
        return [where["num"], where["den"]]
    return [where["distribution"]] if "distribution" in where and "distributions" not in where else []


def _claim_entities(ledger: Sequence[Mapping[str, Any]], instances: Instances) -> list[dict[str, Any]]:
    """Each claim (the tables its statistic reads, its cells' parts of them) and its values."""
    from ..claims import STATISTICS

    out = []
    for row in ledger:
        cid, where = str(row["id"]), row.get("where") or {}
        record = STATISTICS.get(str(row.get("statistic")))
        tables = record.tables if record is not None else ()
        based = [rel for t in tables for rel, _ in instances.get(t, ())]
        names = _claim_cells(where)
        if names:
            # a table gathered from per-cell parts is its writer's input of the same name (gather's)
            parts = {_inputs_of(w).get(t) for t in tables for w in ARTIFACTS[t].writers} - {None}
            based += [rel for a in ARTIFACTS if a in parts for rel, values in instances.get(a, ())
                      if {"distribution", "dim"} <= set(values) and str(values["dim"]) == str(where["dim"])
                      and values["distribution"] in names]
        values = [_property(f"{cid}-{field}", row[field]) | {"name": field}
                  for field in _CLAIM_VALUES if row.get(field) is not None]
        out.append({"@id": f"#claim-{cid}", "@type": "Claim", "identifier": cid, "name": cid,
                    "text": str(row.get("statement", "")), "isBasedOn": _id_ref(based),
                    "additionalProperty": _id_ref(v["@id"] for v in values)})
        out.extend(values)
    return out


def _workflow_entity(root: Path, commit: str | None, software: Sequence[Mapping[str, Any]],
                     inputs: Mapping[str, str], parameters: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The Snakefile as the crate's main entity: a ComputationalWorkflow at its commit."""
    workflow = {"@id": "Snakefile", "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow"],
                "name": "kvasym",
                "description": "the DAG that regenerates the study's numbers, figures, tables and paper",
                "programmingLanguage": {"@id": _SNAKEMAKE},
                "softwareRequirements": _id_ref(s["@id"] for s in software),
                "input": _id_ref(f"#input-{role}" for role in inputs),
                "output": _id_ref(p["@id"] for p in parameters if p["@id"].startswith("#artifact-")),
                "conformsTo": {"@id": "https://bioschemas.org/profiles/ComputationalWorkflow/1.0-RELEASE"}}
    if commit:
        workflow["version"] = commit
    if (root / "Snakefile").is_file():
        workflow["sha256"] = _file_digest(root / "Snakefile")
    return workflow


def _run_entity(end_text: str, input_ids: Sequence[str], result_ids: Sequence[str], config_sha256: str,
                clean: bool | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's action (what it read and wrote) and its values (config hash, clean tree)."""
    values = [_property("config_sha256", config_sha256)
              | {"description": "SHA-256 of the effective config (canonical JSON, defaults filled in)"}]
    if clean is not None:  # without git there is nothing to say (a JSON-LD null would drop the value)
        values.append(_property("git_clean", clean) | {"description": "the checkout had no change against its commit"})
    run = {"@id": "#run", "@type": "CreateAction", "name": "snakemake run of kvasym", "endTime": end_text,
           "instrument": {"@id": "Snakefile"}, "actionStatus": {"@id": _COMPLETED}, "object": _id_ref(input_ids),
           "result": _id_ref(result_ids), "additionalProperty": _id_ref(v["@id"] for v in values)}
    return run, values


def _languages(packages: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
    """Snakemake and Python as languages (with the versions that ran) and the profiles."""
    version = {p["name"]: p["version"] for p in packages}
    out = [{"@id": _SNAKEMAKE, "@type": "ComputerLanguage", "name": "Snakemake",
            "url": {"@id": "https://snakemake.readthedocs.io"}}
           | ({"version": version["snakemake"]} if "snakemake" in version else {}),
           {"@id": "#python", "@type": "ComputerLanguage", "name": "Python"}
           | ({"version": version["Python"]} if "Python" in version else {})]
    return out + [{"@id": profile, "@type": "CreativeWork", "name": profile.rsplit("/", 2)[-2],
                   "version": profile.rsplit("/", 1)[-1]} for profile in PROFILES]


def crate_slice(config: Mapping[str, Any], configfiles: Sequence[str], claims_file: str,
                unit_writers: Mapping[str, str]) -> dict[str, Any]:
    """The rule's param: the files the run read (``config``, ``config_2``, ..., ``claims_file``
    and the claims files it extends, ``claims_file_extends_1``, ...), the SHA-256 of the
    effective config and who wrote each distribution's metrics (:func:`build_crate`'s
    ``unit_writers``)."""
    from ..claims import claims_files
    from .reproduce import effective_config_sha256

    inputs = {("config" if i == 0 else f"config_{i + 1}"): str(f) for i, f in enumerate(configfiles)}
    inputs["claims_file"] = str(claims_file)
    # the claims files it extends (key extends), the first-extended first
    for i, extended in enumerate(claims_files(claims_file)[:-1]):
        inputs[f"claims_file_extends_{i + 1}"] = str(extended)
    return {"inputs": inputs, "config_sha256": effective_config_sha256(config),
            "unit_writers": dict(sorted(unit_writers.items()))}


def write_crate(crate: Mapping[str, Any], out: str | os.PathLike) -> None:
    """Write ``crate`` as JSON (two-space indent) atomically."""
    from ..atomic import write_text_atomic

    # allow_nan=False: NaN is not JSON; a ledger value that is not a number fails here, named
    write_text_atomic(json.dumps(crate, indent=2, ensure_ascii=False, allow_nan=False) + "\n", out)
