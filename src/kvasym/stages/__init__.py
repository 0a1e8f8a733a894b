"""The DAG's stages: one module per Snakemake rule (or rule family), one entry point each.

A stage's name is its rule's name, its module's name and its ``kvasym stage`` subcommand:
rule ``cells`` runs ``kvasym stage cells``, implemented by :mod:`kvasym.stages.cells`;
the figure rules ``figure_<family>`` run ``kvasym stage figure --family <family>``
(:mod:`kvasym.stages.figure`). Every stage module defines

- ``add_arguments(parser)``: its flags (inputs, outputs and, for grid stages, ``--slice``, the
  narrow config slice the job depends on, as JSON);
- ``run(args)``: reads its inputs, calls the library and writes its outputs atomically;
- ``INPUTS`` (optional): its inputs, argument name (``args`` attribute) -> the artifact of
  :mod:`kvasym.artifacts` it is given, whose flags :func:`kvasym.artifacts.add_input_arguments`
  declares; ``INTERMEDIATE_INPUTS`` (optional) names further arguments whose files are outputs
  of other rules (a folder given whole, as rule metrics's packed caches). When one of them is
  damaged (truncated, not of its format, failing its digest, filed under the wrong cell), the
  stage moves it aside (:func:`move_aside_damaged`) so that the next run rebuilds it instead of
  failing on it again.

Stages hold no maths: that lives in the library modules they call. The registry below maps a
stage to its one-line description; modules are imported only when their stage runs, so a
``kvasym stage cells`` job does not pay for pandas or matplotlib.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
from pathlib import Path
from types import ModuleType

from ..artifacts import DAG_FOLDER

__all__ = ["STAGES", "add_stage_parsers", "move_aside_damaged", "stage_module"]

#: Stage (= rule = module) name -> what it does, in DAG order.
STAGES: dict[str, str] = {
    "cells": "every cell of one (distribution, dim): data manifest, packed caches, per-query and per-key metrics",
    "metrics": "the cells of one query-model variant (distribution, dim), measured on its parent's packed caches",
    "capture": "real K, V and queries of SmolLM2-135M for the shipped texts, one model load (needs the real extra)",
    "real_metrics": "per-query metrics of the real-model cells of one scheme, every budget (SmolLM2 captures)",
    "real_metrics_extra": "per-query metrics of one real-model cell at one of its scheme's frontier extra budgets",
    "real_cachestats": "statistics of the real caches per text, layer and head",
    "model_file": "a model's GGUF file assembled from the chunk packages pip installed, checked by size and SHA-256",
    "calibrate": "query-aware bases of one model: per layer and KV head, the eigenbasis of its queries on "
                 "calibration texts",
    "e2e": "end-to-end passes of one model over one text with its KV cache quantized, or one part of them "
           "(needs the real extra)",
    "e2e_join": "one text's end-to-end passes from its parts (rule e2e), row for row in the passes' order",
    "e2e_long": "long-context passes of SmolLM2-135M over windows of one length of the long offline text",
    "passkey": "passkey retrieval trials of one length, full precision and with each quantized cache",
    "greedy": "greedy-decode agreement of one model's quantized caches with full precision, on a few prompts",
    "sensitivity": "the model card's calibration on one text: K/V sensitivity curves per layer and cache statistics",
    "card": "a model card's passes: measured bit allocation against uniform end to end (measurements, tables)",
    "card_page": "the model card: its measurements with the end-to-end frontier, as JSON and as HTML (figures inlined)",
    "e2e_stats": "perplexity, next-token KL and top-1 per scheme and budget, paired tests, layer sensitivity",
    "file_metrics": "per-query metrics of one bring-your-own cache cell (distribution kind file)",
    "stats": "scheme-pair tests, KL ratio intervals and summaries of one (distribution, dim)",
    "theory": "QJL variance ratios against closed forms, Beta marginals, Jensen slope of one (distribution, dim)",
    "frontier": "rate-distortion frontier: measured total bits against attention damage of every scheme, Pareto set",
    "seq_len_sweep": "sequence-length sweep: attention damage against the number of keys, slopes in log-log",
    "gather": "concatenate the per-(distribution, dim) tables, adding Holm-adjusted p-values",
    "claims": "evaluate the claims ledger from the gathered tables",
    "figure": "draw the figures of one figure family (or all) from the gathered tables",
    "tables": "the paper's LaTeX tables (jinja2) from the gathered tables",
    "numbers": "numbers.tex: a macro for every number and name the paper's prose quotes",
    "reproduce": "reproduce.tex: commands, commit, hashes, versions, machine, job costs, claims amendments",
    "paper": "the paper PDF (latexmk) from its sources and the generated parts",
    "crate": "the run as a Workflow Run RO-Crate at the checkout's root, each claim linked to the files it came from",
}


def stage_module(name: str) -> ModuleType:
    """The module of stage ``name`` (imported now)."""
    if name not in STAGES:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}")


def intermediate_inputs(args: argparse.Namespace) -> set[Path]:
    """The files of ``args`` that stage ``args.stage_name`` declares as DAG intermediates."""
    module = stage_module(args.stage_name)
    names = (*getattr(module, "INPUTS", {}), *getattr(module, "INTERMEDIATE_INPUTS", ()))
    files: set[Path] = set()
    for name in names:
        value = getattr(args, name, None)
        for item in ([] if value is None else [value] if isinstance(value, (str, Path)) else value):
            files.add(Path(item).absolute())
    return files


def move_aside_damaged(args: argparse.Namespace, path: str) -> str:
    """What to do about a damaged input ``path`` of a stage run with ``args``, as a sentence.

    A DAG intermediate (or the intermediate folder holding it) is renamed to ``.<name>.damaged``
    beside it (replacing an older file; an older folder of that name is deleted first):
    Snakemake then sees it missing and reruns the rule that writes it, while the damaged bytes
    stay for inspection. The leading dot keeps it out of the Parquet datasets (pyarrow and
    pandas skip names starting with "." when they read a folder). Snakemake itself cannot
    notice the damage: an intermediate edited or truncated after its job ended only looks newer
    than its consumers' outputs, so without this every rerun would fail on it again. A file the
    user gave (a cache dump, the claims file) is never touched, nor is a declared intermediate
    that lies outside every ``results/`` folder (``kvasym stage metrics --packed`` given the user's
    own caches, say, or a ``cp -r`` copy of a folder a stage wrote: location decides, never the
    marker file such a copy carries along).
    """
    from ..atomic import FOLDER_MARKER

    target = Path(path).absolute()
    intermediates = intermediate_inputs(args)
    if target not in intermediates and not any(f in target.parents for f in intermediates):
        return "fix or replace it and rerun"
    # a file inside a folder a stage wrote whole (a directory() output, kvasym.atomic.atomic_folder,
    # marked by FOLDER_MARKER): the folder goes aside, since Snakemake reruns a rule only for an
    # output that is missing, not for a file missing inside one
    # Where it lies decides, not the flag it came by (issue 33, point 1: a stage run by hand may be
    # given the user's own packed caches or tables) and not a marker it carries (issue 51, point 1:
    # a `cp -r` copy of a folder a stage wrote carries FOLDER_MARKER along, and such a copy outside
    # results/ was renamed): only a file under a results/ folder (where the DAG writes,
    # kvasym.artifacts.DAG_FOLDER) is the DAG's to move; anything else is left where it is.
    if DAG_FOLDER not in target.parent.parts:
        return "it is not in a results/ folder, so it is yours: fix or replace it and rerun"
    whole = next((p for p in list(target.parents)[:3]
                  if (p / FOLDER_MARKER).is_file() and DAG_FOLDER in p.parent.parts), None)
    target = whole or target
    aside = target.with_name(f".{target.name}.damaged")
    try:
        if target.is_dir() and aside.is_dir():
            import shutil

            shutil.rmtree(aside)
        target.replace(aside)
    except FileNotFoundError:  # a concurrent consumer of the same file moved it first
        return "it was moved aside by another job; rerun to rebuild it"
    except OSError as exc:
        return f"could not move it aside ({exc.strerror or exc}); delete it and rerun to rebuild it"
    return f"moved aside to {aside.name}; rerun and the rule that writes it rebuilds it"


def add_stage_parsers(subparsers: argparse._SubParsersAction, only: str | None = None) -> None:
    """One subparser per stage; with ``only``, only that stage imports its module and declares
    its flags (the others are listed with their description, for ``--help``)."""
    for name, description in STAGES.items():
        parser = subparsers.add_parser(name, help=description, description=description)
        if only is None or name == only:
            module = stage_module(name)
            module.add_arguments(parser)
            parser.set_defaults(func=module.run, stage_name=name)


@functools.lru_cache(maxsize=None)
def _module_file(module: str) -> Path | None:
    """The source file of a ``kvasym`` module name, or None (not ours, or not a file)."""
    root = Path(__file__).resolve().parent.parent  # src/kvasym
    parts = module.split(".")
    if parts[0] != "kvasym":
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# An import statement at the start of a line (any indentation: lazy imports count), with its
# parenthesised continuation lines. Every Snakemake process computes the 20 stages' digests (on
# Slurm: one process per job of a group job, workflow/profiles/slurm); scanning for these
# statements instead of parsing each module whole, and reading each file once, took that from
# 0.65 s to 0.05 s per process.
_IMPORT_STATEMENT = re.compile(
    r"^[ \t]*(?:from[ \t]+[.\w]+[ \t]+import[ \t]*(?:\([^)]*\)|[^\n]*)|import[ \t]+[^\n]*)", re.MULTILINE
)


def _names_imported(tree: ast.AST, package: str) -> frozenset[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found.add(stem)
            found |= {f"{stem}.{alias.name}" for alias in node.names}  # `from . import x` imports a module
    return frozenset(name for name in found if name.startswith("kvasym"))


def _package_of(path: Path, module: str) -> str:
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def _imports_by_parsing(path: Path, module: str) -> frozenset[str]:
    """The reference for :func:`_imports`: every ``kvasym`` module named by an import statement
    anywhere in the parsed module."""
    return _names_imported(ast.parse(path.read_text(encoding="utf-8")), _package_of(path, module))


@functools.lru_cache(maxsize=None)
def _imports(path: Path, module: str) -> frozenset[str]:
    """Every ``kvasym`` module ``path`` (module ``module``) imports, at any depth of its code
    (lazy imports inside functions included), absolute or relative.

    Only the import statements are parsed (found by :data:`_IMPORT_STATEMENT`); a line of a
    docstring that reads like an import and parses as one would count too, which can only add a
    file to a digest. The test suite checks that this equals :func:`_imports_by_parsing` for
    every module of the package."""
    statements = [match.group(0).strip() for match in _IMPORT_STATEMENT.finditer(path.read_text(encoding="utf-8"))]
    package = _package_of(path, module)
    found: set[str] = set()
    for statement in statements:
        if "kvasym" not in statement and not statement.startswith("from ."):
            continue
        try:
            found |= _names_imported(ast.parse(re.sub(r"#[^\n]*", "", statement)), package)
        except SyntaxError:  # prose that begins with "import" or "from ... import"
            continue
    return frozenset(found)


#: The figure registry, whose drawing callables import each family's own modules.
FIGURE_REGISTRY_MODULE = "kvasym.render.figures.registry"


@functools.lru_cache(maxsize=None)
def _registry_imports() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The figure registry's imports, parsed once: those outside its drawing callables, and each
    drawing callable's own (by function name)."""
    from ..render.figures.registry import FIGURE_FAMILIES

    path = _module_file(FIGURE_REGISTRY_MODULE)
    package = _package_of(path, FIGURE_REGISTRY_MODULE)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    draws = {spec.draw.__name__ for spec in FIGURE_FAMILIES.values()}
    drawing = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in draws}
    tree.body = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name in drawing)]
    return _names_imported(tree, package), {name: _names_imported(node, package) for name, node in drawing.items()}


def _family_imports(family: str) -> frozenset[str]:
    """What the figure registry imports for family ``family``: its module-level imports and
    those of its functions, but of the drawing callables of :data:`FIGURE_FAMILIES
    <kvasym.render.figures.registry.FIGURE_FAMILIES>` only ``family``'s own (the other
    families' modules are not code this family's job runs)."""
    from ..render.figures.registry import FIGURE_FAMILIES

    if family not in FIGURE_FAMILIES:
        raise KeyError(family)
    shared, drawing = _registry_imports()
    return shared | drawing.get(FIGURE_FAMILIES[family].draw.__name__, frozenset())


def stage_code_files(name: str, family: str | None = None) -> list[Path]:
    """The files whose content :func:`stage_code_digest` hashes for stage ``name``: its module,
    every ``kvasym`` module it imports transitively (lazy imports included), and the package
    data it reads: the LaTeX templates for ``tables``, the shipped texts for ``capture``.

    ``family``: for stage ``figure``, the code of one family's job (:func:`_family_imports`):
    editing one family's module redraws that family only."""
    if name not in STAGES:
        raise KeyError(name)
    if family is not None and name != "figure":
        raise KeyError(f"stage {name} has no families")
    todo: list[str] = [f"{__name__}.{name}"]
    seen: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        path = _module_file(module)
        if path is None or module in seen:
            continue
        seen[module] = path
        imports = _family_imports(family) if family is not None and module == FIGURE_REGISTRY_MODULE \
            else _imports(path, module)
        todo.extend(imports - set(seen))
    files = sorted(set(seen.values()))
    package = Path(__file__).resolve().parent.parent
    data = {"tables": package.glob("templates/table_*.j2"), "reproduce": package.glob("templates/reproduce.tex.j2"),
            "capture": package.glob("real/texts/*.txt")}
    return files + sorted(data.get(name, ()))


@functools.lru_cache(maxsize=None)
def stage_code_digest(name: str, family: str | None = None) -> str:
    """SHA-256 of the code stage ``name`` runs (:func:`stage_code_files`: names and contents; of
    one figure family's job with ``family``).

    The rules pass it as a param, so Snakemake's params trigger reruns a stage, and only that
    stage and what follows, when its code changes (a template edit rebuilds the tables; an edit
    of the figures module redraws the figures but recomputes no metric). A Python module counts
    as its code, not its text (:func:`code_digest`): an edit of its comments, docstrings or
    layout reruns nothing. The tables of declarations listed in :mod:`kvasym.stages._registries`
    count by the entries the stage reads, not whole: editing one artifact's path, one scheme's
    description or a memory request reruns the jobs it can change, not every importer.
    """
    import hashlib

    from ..study import canonical_json
    from ._registries import registry_entries, stripped_tables

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    files = stage_code_files(name, family)
    for path in files:
        relative = path.relative_to(root).as_posix()
        content = code_digest(path, stripped_tables(relative)).encode() if path.suffix == ".py" \
            else _file_bytes(path)
        digest.update(relative.encode() + b"\0" + content + b"\0")
    digest.update(b"registry entries\0" + canonical_json(registry_entries(name, files, STAGES)).encode())
    return digest.hexdigest()


def normalized_code(source: bytes, tables: tuple[str, ...] = ()) -> str:
    """A module's code without its comments, docstrings and layout: :func:`ast.dump` of its parse
    tree with the leading string constant of the module and of each class and function body
    removed. Two sources give the same string exactly when they differ only in those.

    ``tables``: module-level names whose assigned values are replaced by ``...`` (``"*"``: every
    module-level assignment but ``__all__``), the registry tables whose entries a stage's digest
    counts one by one (:mod:`kvasym.stages._registries`)."""
    import ast

    tree = ast.parse(source)
    if tables:
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            names = {target.id for target in targets if isinstance(target, ast.Name)}
            if names and names != {"__all__"} and node.value is not None \
                    and ("*" in tables or names & set(tables)):
                node.value = ast.Constant(value=Ellipsis)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


@functools.lru_cache(maxsize=None)
def code_digest(path: Path, tables: tuple[str, ...] = ()) -> str:
    """SHA-256 of :func:`normalized_code` of the module at ``path`` (``tables`` left out).

    Parsing the package's modules takes about a second, which every Snakemake process (one per
    job of a Slurm group job) would pay: the digest is kept in ``$KVASYM_CACHE_DIR/code`` (else
    ``~/.cache/kvasym/code``) under the SHA-256 of the file's bytes, so a module is parsed once per
    machine and version of its text. The cache is an optimisation only: an entry that cannot be
    read or written is computed again.
    """
    import hashlib
    import os

    raw = _file_bytes(path)
    key = hashlib.sha256(raw + (b"\0tables:" + ",".join(tables).encode() if tables else b"")).hexdigest()
    root = os.environ.get("KVASYM_CACHE_DIR")
    entry = (Path(root) if root else Path.home() / ".cache" / "kvasym") / "code" / key
    try:
        cached = entry.read_text(encoding="ascii")
        if re.fullmatch(r"[0-9a-f]{64}", cached):
            return cached
    except (OSError, UnicodeDecodeError):
        pass
    value = hashlib.sha256(normalized_code(raw, tables).encode()).hexdigest()
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        temporary = entry.with_name(f".{key}.{os.getpid()}")
        temporary.write_text(value, encoding="ascii")
        temporary.replace(entry)
    except OSError:
        pass
    return value


@functools.lru_cache(maxsize=None)
def _file_bytes(path: Path) -> bytes:
    return path.read_bytes()  # the stages share most of their modules: each file is read once
