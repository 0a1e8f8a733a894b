"""The float-only pages of a LaTeX build, and the gate that no such page holds one small float.

A page that holds a single small figure and nothing else wastes most of a page and breaks the
reading (issue 15, item 3: "no page holding one small float"). LaTeX builds a float-only page
in one place, the kernel's ``\\@vtryfc`` (both when a float page is tried at the start of a
column and when ``\\clearpage`` flushes the floats left over). :data:`FLOAT_PAGE_HOOK` wraps it:
before the page is made it records how many floats the page receives, each one's height and
the column height; when the page is shipped out it writes one line to ``<jobname>.fpg``::

    \\kvfloatpage{<pages shipped before it>}{<\\thepage>}{<count>}{<total>}{<h1,h2,...>}{<colht>}

The hook is plain LaTeX2e (2020-10 or later, for the ``shipout/before`` hook) and is loaded
before the document by latexmk's ``-usepretex`` (:mod:`kvasym.stages.paper`), so the paper's
own sources stay untouched. Reading the PDF instead (pages whose text is only captions) does not
work here: the figures are PDFs whose axis labels pdftotext extracts as text.

:func:`float_pages` reads the record back, naming the floats of each page from the ``.aux``
file's labels (a float's ``\\label`` is written at shipout, so its page is the float's page);
:func:`check_float_pages` is the paper stage's gate: a float-only page holding a single float
shorter than :data:`MIN_FLOAT_FRACTION` of the text height fails the build.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import KvasymError

__all__ = ["FLOAT_PAGE_HOOK", "FLOAT_PAGE_SUFFIX", "HOOK_FILE", "MIN_FLOAT_FRACTION", "FloatPage",
           "check_float_pages", "float_labels", "float_pages", "lone_small_floats", "write_hook"]

#: A float-only page must hold more than one float, or one at least this fraction of the
#: text height: below it, most of the page is empty (layout.tex's \floatpagefraction, 0.7,
#: keeps LaTeX from making such pages on its own; \clearpage still can).
MIN_FLOAT_FRACTION = 0.5
#: The record the hook writes beside the PDF: ``<jobname>.fpg``.
FLOAT_PAGE_SUFFIX = "fpg"
#: The hook's file, written into latexmk's output folder by :func:`write_hook`.
HOOK_FILE = "kvasym-floatpages.tex"

#: The LaTeX hook (read before ``\documentclass``): it records each float-only page.
FLOAT_PAGE_HOOK = r"""% kvasym.render.floatpages: record every float-only page in \jobname.fpg. Do not edit.
\makeatletter
\newwrite\kv@fpfile
\gdef\kv@fpinfo{}
\AtBeginDocument{\immediate\openout\kv@fpfile=\jobname.fpg\relax}
\let\kv@orig@vtryfc\@vtryfc
% \@vtryfc builds a float-only page from the floats of \@flsucceed (\@elt\box...)
\def\@vtryfc#1{%
  \begingroup
    \count@\z@ \dimen@\z@ \let\kv@heights\@empty
    \def\@elt##1{\advance\count@\@ne \advance\dimen@\ht##1\relax
      \edef\kv@heights{\kv@heights\ifx\kv@heights\@empty\else,\fi\the\ht##1}}%
    \@flsucceed
    \xdef\kv@fpinfo{{\the\count@}{\the\dimen@}{\kv@heights}{\the\@colht}}%
  \endgroup
  \kv@orig@vtryfc{#1}}
% the page just made is the next one shipped out (one-column output)
\AddToHook{shipout/before}{%
  \ifx\kv@fpinfo\@empty\else
    \immediate\write\kv@fpfile{\string\kvfloatpage{\the\ReadonlyShipoutCounter}{\thepage}\kv@fpinfo}%
    \global\let\kv@fpinfo\@empty
  \fi}
\makeatother
"""

_RECORD = re.compile(r"\\kvfloatpage\{(\d+)\}\{([^{}]*)\}\{(\d+)\}\{([0-9.]+)pt\}\{([0-9.pt,]*)\}\{([0-9.]+)pt\}")


@dataclass(frozen=True)
class FloatPage:
    """One float-only page: its page in the PDF (1-based), its printed number (``\\thepage``),
    the heights of its floats (pt), the text height (pt) and the floats' labels with their
    numbers (``Figure 3 (fig:kl_ecdf)``; empty when the floats have no label)."""

    pdf_page: int
    page: str
    heights: tuple[float, ...]
    text_height: float
    floats: tuple[str, ...]

    @property
    def fraction(self) -> float:
        """The share of the text height its floats fill."""
        return sum(self.heights) / self.text_height if self.text_height > 0 else 0.0

    def __str__(self) -> str:
        names = ", ".join(self.floats) or f"{len(self.heights)} unlabelled float(s)"
        where = "alone on a float page" if len(self.heights) == 1 else "on a float page of their own"
        return f"page {self.page} (PDF page {self.pdf_page}): {names} {where}, {self.fraction:.0%} of the text height"


def write_hook(folder: str | Path) -> Path:
    """Write :data:`FLOAT_PAGE_HOOK` to ``<folder>/``:data:`HOOK_FILE`; returns its path."""
    path = Path(folder) / HOOK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FLOAT_PAGE_HOOK, encoding="utf-8")
    return path


def _groups(text: str, pos: int, count: int) -> tuple[list[str], int]:
    """Up to ``count`` balanced ``{...}`` groups of ``text`` from ``pos`` (spaces between them
    skipped): their contents and the position after the last one."""
    out: list[str] = []
    while len(out) < count:
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        depth, start = 0, pos
        while pos < len(text):
            if text[pos] == "\\":
                pos += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            pos += 1
            if depth == 0:
                break
        out.append(text[start + 1:pos - 1])
    return out, pos


def float_labels(aux: str) -> dict[str, list[str]]:
    """Printed page -> the float labels on it (``Figure 3 (fig:kl_ecdf)``), from an ``.aux``
    file's ``\\newlabel`` lines: a label whose hyperref anchor is a figure's or a table's, or,
    without hyperref, whose name starts with ``fig:`` or ``tab:``."""
    out: dict[str, list[str]] = {}
    for hit in re.finditer(r"\\newlabel\{([^{}]*)\}", aux):
        outer, _ = _groups(aux, hit.end(), 1)
        fields, _ = _groups(outer[0], 0, 5) if outer else ([], 0)
        if len(fields) < 2:
            continue
        name, number, page = hit[1], fields[0], fields[1]
        anchor = fields[3] if len(fields) > 3 else ""
        kind = next((k for k, prefixes in (("Figure", ("figure.", "fig:")), ("Table", ("table.", "tab:")))
                     if anchor.startswith(prefixes[0]) or name.startswith(prefixes[1])), None)
        if kind:
            out.setdefault(page, []).append(f"{kind} {number} ({name})")
    return out


def label_page(aux: str, name: str) -> str | None:
    """The printed page of label ``name`` in an ``.aux`` file's ``\\newlabel`` lines (the second
    field of ``\\newlabel{name}{{number}{page}...}``), or None when the file does not define it."""
    for hit in re.finditer(r"\\newlabel\{([^{}]*)\}", aux):
        if hit[1] != name:
            continue
        outer, _ = _groups(aux, hit.end(), 1)
        fields, _ = _groups(outer[0], 0, 2) if outer else ([], 0)
        return fields[1] if len(fields) > 1 else None
    return None


def float_pages(record: str, aux: str = "") -> list[FloatPage]:
    """Every float-only page of a build, in page order, from the hook's record (the text of
    ``<jobname>.fpg``) and, for the floats' names, the ``.aux`` file's text."""
    labels = float_labels(aux)
    pages = []
    for hit in _RECORD.finditer(record):
        shipped, page, _count, _total, heights, colht = hit.groups()
        sizes = tuple(float(h.removesuffix("pt")) for h in heights.split(",") if h)
        pages.append(FloatPage(int(shipped) + 1, page, sizes, float(colht), tuple(labels.get(page, []))))
    return pages


def lone_small_floats(pages: Sequence[FloatPage], min_fraction: float = MIN_FLOAT_FRACTION) -> list[FloatPage]:
    """The float-only pages holding one float shorter than ``min_fraction`` of the text height."""
    return [p for p in pages if len(p.heights) == 1 and p.fraction < min_fraction]


def check_float_pages(record_path: str | Path, aux_path: str | Path | None = None, *,
                      min_fraction: float = MIN_FLOAT_FRACTION) -> list[FloatPage]:
    """Raise :class:`KvasymError` naming every float-only page that holds a single float
    shorter than ``min_fraction`` of the text height (its page, its float, how full it is);
    return the build's float-only pages otherwise. A missing record is an error too: the
    document was built without :data:`FLOAT_PAGE_HOOK`, so its float pages are unknown."""
    path = Path(record_path)
    if not path.is_file():
        raise KvasymError(f"{path}: no record of the float-only pages (the build must load {HOOK_FILE} "
                          "before the document: latexmk -usepretex, kvasym.stages.paper.build_pdf)")
    aux = Path(aux_path) if aux_path is not None else path.with_suffix(".aux")
    pages = float_pages(path.read_text(encoding="latin-1"), aux.read_text(encoding="latin-1") if aux.is_file() else "")
    lone = lone_small_floats(pages, min_fraction)
    if lone:
        listed = "\n  ".join(str(p) for p in lone)
        raise KvasymError(f"{path}: {len(lone)} page(s) hold one float shorter than {min_fraction:.0%} of the text "
                          f"height and nothing else; place it beside text (a [tb] float, a larger figure, or "
                          f"another float on the page):\n  {listed}")
    return pages
