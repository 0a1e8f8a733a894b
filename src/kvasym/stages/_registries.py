"""Registry tables in the stages' code digests: editing one entry reruns the stages that read it.

Six modules hold tables of declarations beside their code: the artifact catalogue
(:data:`kvasym.artifacts.ARTIFACTS`: each file's path template, writers, condition and
description), the jobs' log layout (:data:`kvasym.artifacts.JOB_KEYS`), the stages and their
descriptions (:data:`kvasym.stages.STAGES`), the built-in schemes
(:data:`kvasym.schemes.BUILTIN_SCHEMES`), the real models (:data:`kvasym.real.model_registry.MODELS`)
and the resource requests (:mod:`kvasym.resources`).
Nearly every stage imports them, so hashing them whole into every stage's code digest
(:func:`kvasym.stages.stage_code_digest`) reran the whole DAG when one entry changed. Instead a
stage's digest hashes such a module with the tables of :data:`STRIPPED_TABLES` replaced by a
placeholder (:func:`kvasym.stages.normalized_code`), then :func:`registry_entries`: the entries
the stage can read, which are

- of the artifact catalogue, the artifacts the stage writes (it is among their writers) or names
  in its code (a string literal equal to the artifact's name, as its ``INPUTS`` and the paths a
  renderer prints do): their template, writers and condition. An artifact's description is the
  help text of its flag and reaches no result, but the crate's;
- of the built-in schemes, those the stage names in its code (the query-aware variants are built
  from ``"RKV"``): their K and V specs. A scheme a job runs reaches it through the job's slice,
  which holds the resolved specs (:class:`kvasym.study.Study`), so an edited spec reruns the jobs
  that run that scheme; the descriptions reach the tables stage through its params, and no slice
  holds them;
- of the stages' descriptions, none (the help of ``kvasym stage``) but the crate's; a stage
  added to :data:`kvasym.stages.STAGES` changes no other stage's digest;
- of the model registry (:data:`kvasym.real.model_registry.MODELS`), the whole registry for the
  stages that print every model (the renderers), none for the stages of
  :data:`MODEL_FREE_STAGES`, and for those of :data:`MODEL_JOB_STAGES` the entry of each job's
  own model, in the job's params: adding a model reruns the renderers only, and editing one
  reruns its own jobs and the renderers;
- of the resource requests, none: a request changes no result (a job's BLAS is held at one
  thread by the workflow's shell prefix, and its results are the same bit for bit on any number
  of workers, :mod:`kvasym.workers`);
- for the stages of :data:`WHOLE_TABLE_READERS`, which read a whole table when they run, every
  entry of it whole.

A name built at run time (``f"table_{name}"``) is not a literal: a stage that looks up entries so
reads their table whole (list it in :data:`WHOLE_TABLE_READERS`). ``tests/test_stages.py`` checks
which digests an edit of each kind changes, and ``tests/test_workflow.py`` which jobs rerun.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MODEL_FREE_STAGES", "MODEL_JOB_STAGES", "STRIPPED_TABLES", "WHOLE_TABLE_READERS", "model_entry_record",
           "registry_entries", "stripped_tables"]

#: Module (path under the package) -> the module-level names whose values the code digests leave
#: out; ``"*"`` is every module-level assignment but ``__all__``.
STRIPPED_TABLES: dict[str, tuple[str, ...]] = {
    "artifacts.py": ("_ARTIFACTS", "JOB_KEYS", "_WHEN_WORDS"),
    "schemes.py": ("BUILTIN_SCHEMES",),
    "resources.py": ("*",),
    "stages/__init__.py": ("STAGES",),
    "real/model_registry.py": ("GEMMA3_270M", "MODELS"),
}

#: Stage -> the tables it reads whole when it runs: the crate lists every file with its
#: artifact's description, every job's log and benchmark file and every stage with its
#: description; reproduce sums every job's benchmark file, filed under its job key.
WHOLE_TABLE_READERS: dict[str, frozenset[str]] = {
    "crate": frozenset({"artifacts", "job_keys", "stages"}),
    "reproduce": frozenset({"job_keys"}),
}

#: Stages whose every job runs one model, its ``{model}`` (``{stem}`` for ``model_file``): the
#: job's params record that model's registry entry (:func:`model_entry_record`, by
#: :meth:`kvasym.wiring.Wiring.stage_params`), so an entry's edit reruns that model's jobs.
MODEL_JOB_STAGES = frozenset({"model_file", "calibrate", "e2e", "e2e_join", "e2e_long", "passkey", "greedy",
                              "sensitivity", "card", "card_page"})
#: Stages that read no model's entry: the synthetic grid, the captures (SmolLM2's file, loaded
#: whole: no registry lookup), their metrics and statistics, the frontier and the paper's build.
#: ``tests/test_stages.py`` checks that none of their modules looks an entry up (the config
#: reader in :mod:`kvasym.real` checks the model keys of the config, when the DAG is built).
#: Every other stage reads the registry whole (the renderers print every model's name).
MODEL_FREE_STAGES = frozenset({"cells", "metrics", "capture", "real_metrics", "real_metrics_extra", "real_cachestats",
                               "file_metrics", "stats", "theory", "frontier", "seq_len_sweep", "paper"})

# a quoted string that could be a registry key (artifact and scheme names)
_STRING_LITERAL = re.compile(r"""["']([A-Za-z][A-Za-z0-9_.+-]*)["']""")


def stripped_tables(relative: str) -> tuple[str, ...]:
    """The names :data:`STRIPPED_TABLES` leaves out of module ``relative`` (its path under the
    package, with ``/``), or none."""
    return STRIPPED_TABLES.get(relative, ())


# a module's __all__, whose strings name its own functions (frontier.frontier_points), not entries
_ALL_LIST = re.compile(r"^__all__\s*=\s*[\[(].*?[\])]", re.MULTILINE | re.DOTALL)


@functools.lru_cache(maxsize=None)
def _literals(path: Path) -> frozenset[str]:
    """The quoted strings of a module that could be registry keys, its ``__all__`` left out."""
    return frozenset(_STRING_LITERAL.findall(_ALL_LIST.sub("", path.read_text(encoding="utf-8"))))


def registry_entries(stage: str, code_files: Iterable[Path], stages: Mapping[str, str]) -> dict[str, Any]:
    """The registry entries stage ``stage`` can read (module docstring), as JSON-ready data.

    Parameters
    ----------
    stage : str
        A stage of :data:`kvasym.stages.STAGES`.
    code_files : iterable of Path
        The files of its code (:func:`kvasym.stages.stage_code_files`); the string literals of its
        Python modules decide which entries it names.
    stages : mapping
        :data:`kvasym.stages.STAGES` (given, so that this module imports nothing of the package
        that imports it).

    Returns
    -------
    dict
        ``{"artifacts": {name: entry}, "job_keys": {stage: key}, "models": {key: entry},
        "stages": {stage: description}, "schemes": {name: {K, V}}}``.
    """
    from ..artifacts import ARTIFACTS, JOB_KEYS
    from ..schemes import BUILTIN_SCHEMES

    package = Path(__file__).resolve().parent.parent
    literals: set[str] = set()
    for path in code_files:  # a registry module's own literals are its tables
        if path.suffix == ".py" and path.relative_to(package).as_posix() not in STRIPPED_TABLES:
            literals |= _literals(path)
    whole = WHOLE_TABLE_READERS.get(stage, frozenset())
    artifacts = {}
    for name, item in ARTIFACTS.items():
        if "artifacts" in whole or stage in item.writers or name in literals:
            entry = {"template": item.template, "writers": list(item.writers), "when": item.when}
            if "artifacts" in whole:
                entry["description"] = item.description
            artifacts[name] = entry
    from ..real.model_registry import MODELS

    reads_models = stage not in MODEL_JOB_STAGES | MODEL_FREE_STAGES
    return {
        "artifacts": artifacts,
        "job_keys": dict(JOB_KEYS) if "job_keys" in whole else {},
        "models": {key: model_entry_record(key) for key in MODELS} if reads_models else {},
        "stages": dict(stages) if "stages" in whole else {},
        "schemes": {name: {"K": spec["K"], "V": spec["V"]} for name, spec in BUILTIN_SCHEMES.items()
                    if name in literals},
    }


def model_entry_record(key: str) -> dict[str, Any]:
    """Model ``key``'s registry entry as JSON-ready data (every field, its chunk packages'
    record included): what a job of :data:`MODEL_JOB_STAGES` records in its params."""
    import dataclasses

    from ..real.model_registry import model_entry

    return dataclasses.asdict(model_entry(key))
