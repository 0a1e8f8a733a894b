"""Stage ``paper`` (rule ``paper``): the paper PDF, built by latexmk from ``paper/main.tex``.

The hand-written sections quote only macros; the generated parts (tables, ``numbers.tex``,
``claims.tex``, figures) are the DAG's outputs. A missing LaTeX toolchain is an error naming
what to install (the DAG leaves the PDF out of its default target in that case). A page that
runs into its margins is an error too: any ``Overfull \\hbox`` of the final LaTeX run fails the
build, naming the box, its lines and its source file (:func:`kvasym.render.latexlog.check_no_overfull`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import KvasymError
from ..render.latexlog import UNWRAPPED_LINE, check_no_overfull

#: What a Debian or Ubuntu machine needs for the PDF.
LATEX_PACKAGES = "latexmk texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended"
LATEX_TOOLS = ("latexmk", "pdflatex")


def have_latex() -> bool:
    """Whether latexmk and pdflatex are on PATH."""
    return all(shutil.which(tool) for tool in LATEX_TOOLS)


def build_pdf(main_tex: str | Path, out_dir: str = "build", *, allow_overfull: bool = False) -> Path:
    """Run latexmk (pdf, non-stop, halting on the first error) in the folder of ``main_tex``;
    returns the PDF's path (``<folder>/<out_dir>/<stem>.pdf``). The log is written unwrapped
    (``max_print_line``) and checked: an overfull ``\\hbox`` raises :class:`KvasymError` naming
    it, unless ``allow_overfull``."""
    main = Path(main_tex)
    if not main.is_file():
        raise KvasymError(f"{main}: no such LaTeX file")
    if not have_latex():
        raise KvasymError(f"no LaTeX engine (latexmk, pdflatex) found; Debian: apt-get install {LATEX_PACKAGES}")
    command = ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", f"-outdir={out_dir}", "-cd", str(main)]
    env = {**os.environ, "max_print_line": str(UNWRAPPED_LINE)}
    done = subprocess.run(command, check=False, env=env)
    pdf = main.parent / out_dir / f"{main.stem}.pdf"
    log = main.parent / out_dir / f"{main.stem}.log"
    if done.returncode != 0:
        raise KvasymError(f"latexmk failed with status {done.returncode}; the log is {log}")
    if not allow_overfull:
        check_no_overfull(log)
    return pdf


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--main", required=True, help="the paper's main LaTeX file (paper/main.tex)")
    parser.add_argument("--out-dir", default="build", help="latexmk's output folder, relative to the main file's")
    parser.add_argument("--allow-overfull", action="store_true",
                        help="keep the PDF even when a line runs into the margin (a draft; the DAG never passes it)")


def run(args: argparse.Namespace) -> None:
    print(build_pdf(args.main, args.out_dir, allow_overfull=args.allow_overfull))
