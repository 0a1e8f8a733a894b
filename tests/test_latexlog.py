"""The paper build fails on a line that runs into the margin, naming the box and its file.

(a) the log parser against a hand-written log excerpt (nested files, a parenthesis in prose,
    the box's printed text); (b) a real pdflatex run (skipped loudly without LaTeX): a
    document with one over-wide table fails ``build_pdf`` naming the generated file and the
    lines, the same document with the table fixed builds.
"""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvasym.errors import KvasymError
from kvasym.render.format import BREAK_AFTER, escape_latex, escape_latex_breakable
from kvasym.render.latexlog import check_no_overfull, overfull_boxes
from kvasym.stages.paper import build_pdf

LOG = r"""This is pdfTeX, Version 3.141592653-2.6-1.40.25 (TeX Live 2023/Debian) (preloaded format=pdflatex)
(./main.tex
LaTeX2e <2023-11-01>
(/usr/share/texlive/texmf-dist/tex/latex/base/article.cls
Document Class: article 2023/05/17 v1.4n Standard LaTeX document class
(/usr/share/texlive/texmf-dist/tex/latex/base/size11.clo))
(./generated/numbers.tex) (./sections/intro.tex (see below)
Overfull \hbox (1.5pt too wide) in paragraph at lines 3--4
[]\T1/ptm/m/n/10.95 A long word: supercalifragilistic (and more)
 []

) (./generated/table_tests.tex
Overfull \hbox (43.20145pt too wide) in alignment at lines 12--40
 [] [] []
) [1] (./main.aux) )
"""


def test_boxes_are_found_with_their_file_and_lines():
    boxes = overfull_boxes(LOG)
    assert [(b.overflow_pt, b.source, b.where) for b in boxes] == [
        (1.5, "./sections/intro.tex", "in paragraph at lines 3--4"),
        (43.20145, "./generated/table_tests.tex", "in alignment at lines 12--40"),
    ]
    assert "supercalifragilistic" in boxes[0].text
    assert "table_tests.tex" in str(boxes[1]) and "43.2pt" in str(boxes[1])


def test_a_clean_log_passes_and_a_missing_log_is_named(tmp_path):
    clean = tmp_path / "clean.log"
    clean.write_text(LOG.replace("Overfull", "Underfull"), encoding="latin-1")
    check_no_overfull(clean)
    with pytest.raises(KvasymError, match="no LaTeX log"):
        check_no_overfull(tmp_path / "absent.log")
    dirty = tmp_path / "dirty.log"
    dirty.write_text(LOG, encoding="latin-1")
    with pytest.raises(KvasymError, match=r"(?s)2 overfull box.*table_tests\.tex"):
        check_no_overfull(dirty)


DOC = r"""\documentclass{article}
\begin{document}
Some text.
\input{generated/table_wide}
\end{document}
"""
WIDE = r"\par\noindent\begin{tabular}{l}" + "x" * 400 + r"\end{tabular}\par" + "\n"
NARROW = r"\par\noindent\begin{tabular}{l}fits\end{tabular}\par" + "\n"


def _need_latex(what: str) -> None:
    missing = [tool for tool in ("latexmk", "pdflatex") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"LaTeX TOOLS MISSING ({', '.join(missing)}): {what}. "
                    "Install them with: apt-get install latexmk texlive-latex-recommended")


def test_build_pdf_fails_on_an_overfull_box_naming_it(tmp_path):
    _need_latex("the overfull gate was NOT exercised")
    (tmp_path / "generated").mkdir()
    (tmp_path / "main.tex").write_text(DOC, encoding="utf-8")
    (tmp_path / "generated" / "table_wide.tex").write_text(WIDE, encoding="utf-8")
    with pytest.raises(KvasymError, match=r"(?s)overfull.*lines.*generated/table_wide\.tex.*"):
        build_pdf(tmp_path / "main.tex")
    assert build_pdf(tmp_path / "main.tex", allow_overfull=True).is_file()
    (tmp_path / "generated" / "table_wide.tex").write_text(NARROW, encoding="utf-8")
    assert build_pdf(tmp_path / "main.tex").is_file()


# A ledger row's note as the claims stage writes it when a cell or a config key is off: its long
# tokens (no space inside) cannot break in the note column without the breakable escape.
NOTE = ("not in this grid: no per-trial rows for distribution=lowrank8+isotropic, dim=1024, budget=4, "
        "scheme=KQV, sharpness=2.0; config key seq_len_sweep.seq_lens is empty")


def _note_table(escaped: str) -> str:
    return (r"\par\noindent\begin{tabular}{@{}p{0.15\linewidth}@{}}" + "\n" + escaped + "\n"
            r"\end{tabular}\par" + "\n")


def test_a_generated_note_breaks_inside_its_long_tokens(tmp_path):
    _need_latex("the note column was NOT typeset")
    (tmp_path / "generated").mkdir()
    (tmp_path / "main.tex").write_text(DOC, encoding="utf-8")
    table = tmp_path / "generated" / "table_wide.tex"
    table.write_text(_note_table(escape_latex(NOTE)), encoding="utf-8")
    with pytest.raises(KvasymError, match=r"(?s)overfull.*generated/table_wide\.tex"):
        build_pdf(tmp_path / "main.tex")
    table.write_text(_note_table(escape_latex_breakable(NOTE)), encoding="utf-8")
    assert build_pdf(tmp_path / "main.tex").is_file()


@given(st.text(alphabet=st.sampled_from(list("ab.=+/_,;: 1\\&%$#{}~^<>")), max_size=40))
def test_the_breakable_escape_is_the_escape_plus_break_points(text):
    breakable = escape_latex_breakable(text)
    assert breakable.replace(r"\allowbreak{}", "") == escape_latex(text)
    expected = sum(ch in BREAK_AFTER for ch in text) + sum(
        1 for i in range(1, len(text) - 1) if text[i] == "." and text[i - 1].isalpha() and text[i + 1].isalpha())
    assert breakable.count(r"\allowbreak{}") == expected


SECTIONED = "\\documentclass{article}\n\\begin{document}\n\\section{Alpha}\\label{a}\nSee section \\ref{a}.\n" \
            "\\end{document}\n"


def test_a_truncated_aux_file_heals_on_the_next_build(tmp_path, capsys):
    """Issue 33, point 4: a build killed while pdflatex wrote main.aux left it truncated, and
    every later build failed ("File ended while scanning use of \\@writefile") until the user
    deleted the build folder. The failed run is now retried once from clean auxiliary files; a
    document that is itself broken still fails, leaves no PDF, and says it failed twice."""
    _need_latex("the truncated-aux recovery was NOT exercised")
    main = tmp_path / "main.tex"
    main.write_text(SECTIONED, encoding="utf-8")
    pdf = build_pdf(main)
    aux = tmp_path / "build" / "main.aux"
    text = aux.read_text(encoding="utf-8")
    aux.write_text(text[: text.index("@writefile") + 25], encoding="utf-8")  # cut inside \@writefile{...}
    assert build_pdf(main) == pdf and pdf.is_file()
    assert "building once more from scratch" in capsys.readouterr().out
    assert "\\@writefile" in aux.read_text(encoding="utf-8")  # rewritten whole
    main.write_text(SECTIONED.replace("\\end{document}", "\\undefinedmacro\n\\end{document}"), encoding="utf-8")
    with pytest.raises(KvasymError, match="twice, the second time from a clean build folder"):
        build_pdf(main)
    assert not pdf.exists()
