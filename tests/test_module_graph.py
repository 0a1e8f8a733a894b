"""The library's import graph: no import cycle (issue 30), and no private name crossing files."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
#: None left: the last one (kvasym.cache -> composed -> minmax -> schemes -> cache) went when
#: cache.quantize became a resolved plan (kvasym.plan) run by backends (kvasym.backends), with the
#: row checks and norm storage moved down to kvasym.rows.
KNOWN_CYCLES: list[list[str]] = []


def import_graph(src: Path, package: str = "kvasym") -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside functions."""
    files = {}
    for path in (src / package).rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        files[name] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_no_import_cycle():
    assert cycles(import_graph(SRC)) == KNOWN_CYCLES


def test_the_library_does_not_import_the_checking_tools():
    """tools/ (expected results, numeric environment, report check) checks the library from
    outside and is not in its wheel: no module of src/kvasym imports it, at any depth."""
    importers = []
    for path in sorted((SRC / "kvasym").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name == "tools" or name.startswith("tools.") for name in names):
                importers.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not importers, f"the library imports tools/: {importers}"


def test_the_cycle_finder_sees_a_deferred_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    (package / "c.py").write_text("import pkg.a\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.sub.b"]]


def private_imports(src: Path) -> list[str]:
    """``from <kvasym module> import _name`` of a private name (a private module, such as the
    numba kernels, is allowed: it is imported whole)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            if node.level == 0 and not (node.module or "").startswith("kvasym"):
                continue
            base = path.parent
            for _ in range(max(node.level - 1, 0)):
                base = base.parent
            folder = base.joinpath(*(node.module or "").split(".")) if node.level else None
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    if folder is not None and (folder / f"{alias.name}.py").is_file():
                        continue  # a private module, imported whole
                    module = "." * node.level + (node.module or "")
                    found.append(f"{path.relative_to(src)}: from {module} import {alias.name}")
    return found


def test_no_private_name_crosses_files(tmp_path):
    """A private name (``_x``) is its module's own: one that other modules import is public API
    under a private name (cache._store_norms, codebook._atomic_write_json, claims._json_safe and
    table_e2e._scheme_order were). A planted import must be found."""
    assert private_imports(SRC) == []
    pkg = tmp_path / "kvasym"
    pkg.mkdir()
    (pkg / "a.py").write_text("def _helper():\n    return 1\n")
    (pkg / "_kernel.py").write_text("")
    (pkg / "b.py").write_text("from .a import _helper\nfrom . import _kernel\n")
    assert private_imports(pkg) == ["b.py: from .a import _helper"]
