"""The paper build fails on a page that holds one small float alone, naming the page and the float.

(a) the record parser against a hand-written record and ``.aux`` (pages, heights, labels with
    hyperref's anchors and without); (b) a real pdflatex run through ``build_pdf`` (skipped
    loudly without LaTeX): a document whose ``\\clearpage`` leaves one small figure alone on a
    page fails naming page 2 and the figure; the escape keeps the PDF; a float page with two
    floats, or one tall float, passes.
"""

from __future__ import annotations

import argparse
import shutil

import pytest

from kvasym.errors import KvasymError
from kvasym.render.floatpages import (MIN_FLOAT_FRACTION, check_float_pages, float_labels, float_pages,
                                      lone_small_floats)

RECORD = r"""\kvfloatpage{1}{2}{1}{109.3027pt}{109.3027pt}{550.0pt}
\kvfloatpage{3}{4}{2}{529.64128pt}{365.3775pt,164.26378pt}{550.0pt}
\kvfloatpage{5}{vi}{1}{400.0pt}{400.0pt}{550.0pt}
"""
AUX = r"""\relax
\newlabel{sec:intro}{{1}{1}{Intro}{section.1}{}}
\newlabel{fig:small}{{1}{2}{A small {float} alone}{figure.caption.1}{}}
\newlabel{fig:big}{{2}{4}{Big one}{figure.2}{}}
\newlabel{tab:t}{{1}{4}{A table}{table.1}{}}
\newlabel{fig:plain}{{3}{vi}}
"""


def test_the_record_names_each_float_page_its_floats_and_fill():
    pages = float_pages(RECORD, AUX)
    assert [(p.pdf_page, p.page, len(p.heights)) for p in pages] == [(2, "2", 1), (4, "4", 2), (6, "vi", 1)]
    assert pages[0].fraction == pytest.approx(109.3027 / 550.0)
    assert pages[1].heights == (365.3775, 164.26378) and pages[1].fraction == pytest.approx(529.64128 / 550)
    assert pages[0].floats == ("Figure 1 (fig:small)",)
    assert pages[1].floats == ("Figure 2 (fig:big)", "Table 1 (tab:t)")
    assert pages[2].floats == ("Figure 3 (fig:plain)",)  # no hyperref anchor: the name's prefix
    # one small float alone fails; two floats, or one at 73% of the text height, do not
    assert lone_small_floats(pages) == [pages[0]]
    assert lone_small_floats(pages, min_fraction=0.8) == [pages[0], pages[2]]
    assert "sec:intro" not in str(float_labels(AUX))
    assert str(pages[0]) == "page 2 (PDF page 2): Figure 1 (fig:small) alone on a float page, 20% of the text height"
    assert str(pages[1]).startswith("page 4 (PDF page 4): Figure 2 (fig:big), Table 1 (tab:t) on a float page "
                                    "of their own")


def test_check_float_pages_raises_naming_the_page_and_float(tmp_path):
    record, aux = tmp_path / "main.fpg", tmp_path / "main.aux"
    record.write_text(RECORD, encoding="latin-1")
    aux.write_text(AUX, encoding="latin-1")
    lone = r"(?s)1 page\(s\) hold one float.*page 2 \(PDF page 2\): Figure 1 \(fig:small\)"
    with pytest.raises(KvasymError, match=lone):
        check_float_pages(record)  # the .aux beside the record by default
    assert len(check_float_pages(record, min_fraction=0.1)) == 3
    with pytest.raises(KvasymError, match=r"nothing\.fpg: no record of the float-only pages"):
        check_float_pages(tmp_path / "nothing.fpg")
    assert MIN_FLOAT_FRACTION == 0.5


DOC = r"""\documentclass{article}
\usepackage{hyperref}
\begin{document}
Some text on the first page.
\begin{figure}[p]\centering\rule{4cm}{%(first)s}\caption{The first float}\label{fig:first}\end{figure}
%(second)s
\clearpage
Text after the floats.
\end{document}
"""
SECOND = r"\begin{table}[p]\centering\rule{4cm}{6cm}\caption{A second float}\label{tab:second}\end{table}"


def _need_latex() -> None:
    missing = [tool for tool in ("latexmk", "pdflatex") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"LaTeX TOOLS MISSING ({', '.join(missing)}): the single-float-page gate was NOT exercised. "
                    "Install them with: apt-get install latexmk texlive-latex-recommended")


def test_build_pdf_fails_on_a_page_holding_one_small_float(tmp_path):
    from kvasym.stages.paper import build_pdf

    _need_latex()
    main = tmp_path / "main.tex"
    main.write_text(DOC % {"first": "3cm", "second": ""}, encoding="utf-8")
    with pytest.raises(KvasymError, match=r"(?s)page 2 \(PDF page 2\): Figure 1 \(fig:first\) alone on a float page"):
        build_pdf(main)
    assert build_pdf(main, allow_single_float_pages=True).is_file()
    # two floats share the float page: it passes, and the record says so
    main.write_text(DOC % {"first": "3cm", "second": SECOND}, encoding="utf-8")
    assert build_pdf(main).is_file()
    pages = check_float_pages(tmp_path / "build" / "main.fpg")
    assert [(p.page, p.floats) for p in pages] == [("2", ("Figure 1 (fig:first)", "Table 1 (tab:second)"))]
    # one tall float alone (16 cm of a 550 pt text height, with its caption) passes too
    main.write_text(DOC % {"first": "16cm", "second": ""}, encoding="utf-8")
    assert build_pdf(main).is_file()
    (page,) = check_float_pages(tmp_path / "build" / "main.fpg")
    assert page.fraction > MIN_FLOAT_FRACTION and len(page.heights) == 1


def test_the_paper_stage_has_the_escape_flag():
    from kvasym.stages import paper

    parser = argparse.ArgumentParser()
    paper.add_arguments(parser)
    args = parser.parse_args(["--main", "paper/main.tex", "--allow-single-float-pages"])
    assert args.allow_single_float_pages and not args.allow_overfull
    assert not parser.parse_args(["--main", "paper/main.tex"]).allow_single_float_pages


def test_label_page_reads_the_printed_page_and_the_report_counts_the_pages_before_it(tmp_path):
    from kvasym.render.floatpages import label_page
    from kvasym.stages.paper import APPENDIX_LABEL, main_text_report

    # the lines pdflatex with hyperref writes: {number}{page}{title}{anchor}{}; a title with braces
    aux = ("\\newlabel{sec:e2e}{{7}{9}{What a {quantized} cache does}{section.7}{}}\n"
           f"\\newlabel{{{APPENDIX_LABEL}}}{{{{9}}{{21}}{{Closed forms}}{{section*.51}}{{}}}}\n"
           "\\newlabel{app:roman}{{A}{iv}{Roman}{appendix.A}{}}\n")
    assert label_page(aux, "sec:e2e") == "9"
    assert label_page(aux, APPENDIX_LABEL) == "21"
    assert label_page(aux, "app:roman") == "iv" and label_page(aux, "missing") is None
    path = tmp_path / "main.aux"
    path.write_text(aux, encoding="utf-8")
    assert main_text_report(path) == "main text: 20 pages before the appendix (page 21)"
    path.write_text(aux.replace(APPENDIX_LABEL, "other"), encoding="utf-8")
    assert "unknown length" in main_text_report(path) and APPENDIX_LABEL in main_text_report(path)
    assert "unknown length" in main_text_report(tmp_path / "absent.aux")
