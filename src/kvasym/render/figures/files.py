"""The files of a drawn figure: its PDF and PNG (:func:`save_figure`) and its caption's facts.

:func:`write_figures` is what the figure stage calls for each family: every figure the family's
drawing callable yields (:attr:`kvasym.render.figures.registry.FigureFamily.draw`) becomes
``<name>.pdf``, ``<name>.png`` and ``<name>.caption.tex`` (:mod:`kvasym.render.figures.captions`),
each written atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ...atomic import atomic_target, write_text_atomic
from ._style import PNG_DPI, STYLE
from .captions import CAPTION_SUFFIX, caption_tex

def save_figure(fig: Figure, stem: str | os.PathLike, provenance: Mapping[str, str] | None = None) -> list[Path]:
    """Write ``stem.pdf`` and ``stem.png`` (PNG at :data:`PNG_DPI`), each via a temporary file
    and a rename (no half-written figure under its final name), then close the figure.

    ``provenance`` (e.g. :func:`kvasym.dataset.provenance`: package version, git commit, the
    config slice with its seed) goes into the files' metadata: the PDF's ``Subject`` (as JSON)
    and ``Creator``, one PNG text chunk per key. The PDF carries no creation date, so the same
    figure gives the same bytes on a rerun.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    info = {str(k): str(v) for k, v in (provenance or {}).items()}
    pdf_meta: dict[str, Any] = {"CreationDate": None}
    if info:
        pdf_meta["Creator"] = f"kvasym {info.get('kvasym_version', '')}".strip()
        pdf_meta["Subject"] = json.dumps(info, sort_keys=True)
    written: list[Path] = []
    try:
        with matplotlib.rc_context(STYLE):
            for fmt, extra in (("pdf", {"metadata": pdf_meta}),
                               ("png", {"dpi": PNG_DPI, "metadata": {"Software": None, **info}})):
                target = stem.with_name(f"{stem.name}.{fmt}")
                with atomic_target(target) as tmp:
                    fig.savefig(tmp, format=fmt, **extra)
                written.append(target)
    finally:
        plt.close(fig)  # no-op for a figure pyplot does not manage
        fig.clear()
    return written



def write_figures(drawn: Iterable[tuple[str, Figure]], out_dir: str | os.PathLike,
                  provenance: Mapping[str, str] | None = None) -> list[Path]:
    """Write each figure of ``drawn`` as ``<out_dir>/<name>.pdf``, ``.png`` and ``.caption.tex``.

    Parameters
    ----------
    drawn : iterable of (str, matplotlib.figure.Figure)
        Figure names and figures, drawn one at a time (a family's drawing callable yields them),
        so only one figure is in memory at once.
    out_dir : path-like
        The figures' folder.
    provenance : mapping, optional
        What made the figures (:func:`kvasym.dataset.provenance` of the slice); each file's
        metadata gets it, with ``figure`` = its name.

    Returns
    -------
    list of pathlib.Path
        The files written, per figure its PDF, PNG and caption.
    """
    out = Path(out_dir)
    written: list[Path] = []
    for name, fig in drawn:
        # the caption's facts (cell, panels, lines shown), read from the figure just drawn
        caption = out / f"{name}.{CAPTION_SUFFIX}"
        write_text_atomic(caption_tex(fig) + "\n", caption)
        written.extend(save_figure(fig, out / name, {"figure": name, **(provenance or {})}))
        written.append(caption)
    return written
