"""The generated files the paper's TeX uses, read from the TeX itself (as showyourwork does).

The paper inputs a generated table with ``\\kvtable{<name>}`` (``generated/table_<name>.tex``)
and a figure with ``\\kvfigure{<name>}{...}`` or ``\\kvgraphic{<name>}`` (``figures/<name>.pdf``);
both print a placeholder box when the file is missing, which is right for a part the
configuration leaves out (a run without the real-model extra) and wrong for a name no rule can
ever make (a typo, a table renamed in :data:`kvasym.render.tables.TABLES`, a figure dropped from
:data:`kvasym.render.figures.registry.FIGURES`): that paper would build, silently, with a box in
place of a result. :func:`check_paper_inputs` turns the second case into an error before the DAG
runs; the Snakefile calls it at parse time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import KvasymError

__all__ = ["PAPER_MACROS", "paper_uses", "check_paper_inputs"]

#: Macro -> kind of generated file its first mandatory argument names.
PAPER_MACROS = {"kvtable": "table", "kvfigure": "figure", "kvgraphic": "figure"}
_USE = re.compile(r"\\(" + "|".join(PAPER_MACROS) + r")(?:\[[^\]]*\])?\{([^}]*)\}")
_COMMENT = re.compile(r"(?<!\\)%.*")


def paper_uses(paper_dir: str | os.PathLike) -> dict[str, dict[str, list[str]]]:
    """Every generated table and figure the paper's TeX names, with where.

    Parameters
    ----------
    paper_dir : path-like
        The paper folder: ``main.tex`` and ``sections/*.tex`` are read (comments stripped;
        a macro's own definition, whose argument is a parameter ``#1``, is skipped).

    Returns
    -------
    dict
        ``{"table": {name: ["file:line", ...]}, "figure": {...}}``.
    """
    paper = Path(paper_dir)
    files = [paper / "main.tex", *sorted((paper / "sections").glob("*.tex"))]
    out: dict[str, dict[str, list[str]]] = {kind: {} for kind in set(PAPER_MACROS.values())}
    for tex in files:
        if not tex.is_file():
            continue
        for number, line in enumerate(tex.read_text(encoding="utf-8").splitlines(), start=1):
            for macro, name in _USE.findall(_COMMENT.sub("", line)):
                if "#" in name:
                    continue
                out[PAPER_MACROS[macro]].setdefault(name.strip(), []).append(f"{tex.relative_to(paper)}:{number}")
    return out


def check_paper_inputs(paper_dir: str | os.PathLike, tables: Iterable[str], figures: Iterable[str]) -> None:
    """Refuse a paper that uses a table or figure no rule of the workflow can make.

    Parameters
    ----------
    paper_dir : path-like
        The paper folder (:func:`paper_uses`).
    tables : iterable of str
        Every table name the tables stage can write (``table_<name>.tex``), whatever the config.
    figures : iterable of str
        Every figure name of the figure registry, whatever the config.

    Raises
    ------
    KvasymError
        Naming each unknown name, its kind and the TeX lines that use it.
    """
    known = {"table": set(tables), "figure": set(figures)}
    used = paper_uses(paper_dir)
    problems = [f"{kind} {name!r} (used at {', '.join(where)})"
                for kind in sorted(used) for name, where in sorted(used[kind].items()) if name not in known[kind]]
    if problems:
        raise KvasymError(f"the paper uses generated files no rule makes: {'; '.join(problems)}; "
                          "known tables: " + ", ".join(sorted(known["table"])))
