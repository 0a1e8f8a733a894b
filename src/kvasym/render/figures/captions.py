"""Figure captions written from the drawn figure itself: the cell, the panels and the lines shown.

A caption that states a fact the figure does not show (a cell it is not drawn at, a reference line
it lacks, a distribution it leaves out) misleads the reader. So the factual part of every caption
is read back from the :class:`matplotlib.figure.Figure` the figure stage has just drawn, from the
same data: its title (the cell: dimension, sharpness, budget), the titles of its panels (which
distribution and budget each shows) and the entries of its legends (which schemes, distributions
and reference lines are drawn). :func:`caption_facts` collects them; :func:`caption_tex` writes
them as one LaTeX sentence group, which the paper appends to the hand-written description of what
the figure plots (``\\kvfigure`` in ``paper/main.tex`` reads ``<name>.caption.tex``).

Text from the figure is escaped for LaTeX (:func:`kvasym.render.format.escape_latex`); mathtext segments
``$...$`` made only of safe characters are kept as mathematics, any other is escaped.
"""

from __future__ import annotations

import re
from typing import Any

from ..format import escape_latex
from ._style import MARGIN_TITLE_GID, ROW_MAJOR_GID, row_major_order

__all__ = ["CAPTION_SUFFIX", "caption_facts", "caption_tex"]

#: The caption file of figure ``<name>``: ``<name>.caption.tex`` beside its PDF and PNG.
CAPTION_SUFFIX = "caption.tex"

#: Characters matplotlib draws that LaTeX's T1/utf8 setup does not typeset, as LaTeX.
_UNICODE = {"\u2212": "$-$", "\u2013": "--", "\u2014": "---", "\u00d7": r"$\times$", "\u2264": r"$\leq$",
            "\u2265": r"$\geq$", "\u00b1": r"$\pm$", "\u00b0": r"$^{\circ}$", "\u00b7": r"$\cdot$",
            "\u03c6": r"$\varphi$", "\u03c0": r"$\pi$", "\u03bd": r"$\nu$", "\u03b5": r"$\varepsilon$",
            "\u03b1": r"$\alpha$", "\u03c1": r"$\rho$", "\u03c3": r"$\sigma$", "\u2248": r"$\approx$",
            "\u221e": r"$\infty$", "\u2192": r"$\to$"}
_SAFE_MATH = re.compile(r"^[A-Za-z0-9\\{}_^ ,.+\-=()/|<>']*$")
_MATH = re.compile(r"\$([^$]*)\$")


def _plain(text: str) -> str:
    """Text outside mathtext: escaped, known Unicode symbols as LaTeX, any other character
    beyond Latin-1 by its Unicode name (never a character the LaTeX build cannot typeset)."""
    import unicodedata

    out = []
    for ch in text:
        if ch in _UNICODE:
            out.append(_UNICODE[ch])
        elif ord(ch) > 0xFF:
            out.append(escape_latex(f"<{unicodedata.name(ch, 'U+%04X' % ord(ch)).lower()}>"))
        else:
            out.append(escape_latex(ch))
    return "".join(out)


def _tex(text: str) -> str:
    """Figure text as LaTeX: mathtext kept where safe, everything else escaped."""
    out, pos = [], 0
    for m in _MATH.finditer(text):
        out.append(_plain(text[pos:m.start()]))
        body = m.group(1).replace(r"\mathregular", r"\mathrm")
        out.append(f"${body}$" if _SAFE_MATH.match(body) and body.count("{") == body.count("}")
                   else _plain(m.group(0)))
        pos = m.end()
    out.append(_plain(text[pos:]))
    return " ".join("".join(out).split())


def _has_data(ax: Any) -> bool:
    return ax.get_visible() and bool(ax.lines or ax.collections or ax.images or ax.patches)


def caption_facts(fig: Any) -> dict[str, Any]:
    """What a drawn figure shows: ``title`` (its suptitle), ``panels`` (the titles of the visible
    panels with data, in drawing order, duplicates kept once), ``rows`` (row titles in the right
    margin, ``gid`` ``margin-title``), ``n_panels`` and ``legend`` (the entries of every legend of
    the figure and its panels, duplicates kept once)."""
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    panels, legend = [], []
    axes = [ax for ax in fig.axes if _has_data(ax)]
    rows = []
    for ax in axes:
        for loc in ("center", "left", "right"):
            text = ax.get_title(loc).strip()
            if text and text not in panels:
                panels.append(text)
        for note in ax.texts:  # row titles in the right margin (_style.margin_title)
            text = note.get_text().strip()
            if note.get_gid() == MARGIN_TITLE_GID and text and text not in rows:
                rows.append(text)
    legends = list(getattr(fig, "legends", [])) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    for leg in legends:
        texts = [t.get_text() for t in leg.get_texts()]
        if leg.get_gid() == ROW_MAJOR_GID:  # back in the order the figure gave them (row by row)
            given = [""] * len(texts)
            for i, k in enumerate(row_major_order(len(texts), leg._ncols)):
                given[k] = texts[i]
            texts = given
        for text in texts:
            text = text.strip()
            if text and text not in legend:
                legend.append(text)
    return {"title": " ".join(title.split()), "panels": [" ".join(p.split()) for p in panels],
            "rows": [" ".join(r.split()) for r in rows], "n_panels": len(axes), "legend": legend}


def caption_tex(fig: Any) -> str:
    """The factual part of a figure's caption, as LaTeX: ``Drawn at: <title>. Panels (<n>): <titles>.
    Shown: <legend entries>.`` (parts the figure lacks are left out)."""
    facts = caption_facts(fig)
    parts = []
    if facts["title"]:
        parts.append(f"As drawn: {_tex(facts['title'])}.")
    if facts["panels"] or facts["rows"]:
        listed = "; ".join(_tex(p) for p in facts["panels"])
        if facts["rows"]:
            listed += ("; " if listed else "") + "rows: " + ", ".join(_tex(r) for r in facts["rows"])
        parts.append(f"Panels ({facts['n_panels']}): {listed}.")
    if facts["legend"]:
        parts.append("Shown: " + "; ".join(_tex(e) for e in facts["legend"]) + ".")
    return " ".join(parts)
