"""kvasym.render.paper_inputs: the generated files the paper's TeX names, and the refusal of a
name no rule can make."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvasym.errors import KvasymError
from kvasym.render.figures.registry import FIGURES
from kvasym.render.paper_inputs import check_paper_inputs, paper_uses
from kvasym.render.tables import TABLES

PAPER = Path(__file__).resolve().parents[1] / "paper"
TABLE_NAMES = [name.removeprefix("table_") for name in TABLES]


def test_the_papers_tables_and_figures_are_all_made_by_a_rule() -> None:
    used = paper_uses(PAPER)
    assert {"models", "e2e", "card", "claims"} <= set(used["table"])
    assert {"kl_ecdf", "theory_check"} <= set(used["figure"])  # the e2e figures come in generated tables
    check_paper_inputs(PAPER, TABLE_NAMES, FIGURES)
    # every table the stage writes is one the paper inputs: none is written for nobody
    assert set(used["table"]) == set(TABLE_NAMES)


def test_unknown_names_are_refused_with_their_lines_and_comments_and_definitions_are_not_uses(tmp_path) -> None:
    (tmp_path / "sections").mkdir()
    (tmp_path / "main.tex").write_text(
        "\\newcommand{\\kvtable}[1]{\\input{table_#1}}\\kvgraphic[#1]{#2}\n"
        "% \\kvtable{commented}\n"
        "\\kvtable{e2e} and 50\\% of \\kvtable{typo}\n")
    (tmp_path / "sections" / "a.tex").write_text(
        "x\n\\kvfigure[0.5\\linewidth]{nofig}{caption}\n\\kvgraphic{kl_ecdf}\n")
    used = paper_uses(tmp_path)
    assert used == {"table": {"e2e": ["main.tex:3"], "typo": ["main.tex:3"]},
                    "figure": {"nofig": ["sections/a.tex:2"], "kl_ecdf": ["sections/a.tex:3"]}}
    with pytest.raises(KvasymError, match=r"figure 'nofig' \(used at sections/a.tex:2\); table 'typo' \(used at "
                                          r"main.tex:3\)"):
        check_paper_inputs(tmp_path, TABLE_NAMES, FIGURES)
