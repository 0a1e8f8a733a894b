"""Stage ``paper`` (rule ``paper``): the paper PDF, built by latexmk from ``paper/main.tex``.

The hand-written sections quote only macros; the generated parts (tables, ``numbers.tex``,
``claims.tex``, figures) are the DAG's outputs. A missing LaTeX toolchain is an error naming
what to install (the DAG leaves the PDF out of its default target in that case). A page that
runs into its margins is an error too: any ``Overfull \\hbox`` of the final LaTeX run fails the
build, naming the box, its lines and its source file (:func:`kvasym.render.latexlog.check_no_overfull`),
and so does a page that holds one small float and nothing else: latexmk loads the hook of
:mod:`kvasym.render.floatpages` before the document (``-usepretex``), which records every float-only
page, and :func:`kvasym.render.floatpages.check_float_pages` names each one holding a single float
shorter than half the text height. A failed latexmk run is retried once after deleting the
job's auxiliary files (:func:`clean_auxiliary_files`): a run killed mid-write leaves a truncated
``main.aux`` that would fail every later build; only a failure of the clean build is an error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import KvasymError
from ..render.floatpages import check_float_pages, label_page, write_hook
from ..render.latexlog import UNWRAPPED_LINE, check_no_overfull

#: The label ``paper/main.tex`` sets where the appendix starts: the main text is the pages before it.
APPENDIX_LABEL = "app:start"
#: What a Debian or Ubuntu machine needs for the PDF.
LATEX_PACKAGES = "latexmk texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended"
LATEX_TOOLS = ("latexmk", "pdflatex")


def have_latex() -> bool:
    """Whether latexmk and pdflatex are on PATH."""
    return all(shutil.which(tool) for tool in LATEX_TOOLS)


def build_pdf(main_tex: str | Path, out_dir: str = "build", *, allow_overfull: bool = False,
              allow_single_float_pages: bool = False) -> Path:
    """Run latexmk (pdf, non-stop, halting on the first error) in the folder of ``main_tex``;
    returns the PDF's path (``<folder>/<out_dir>/<stem>.pdf``). The log is written unwrapped
    (``max_print_line``) and checked: an overfull ``\\hbox`` raises :class:`KvasymError` naming
    it, unless ``allow_overfull``. The float-only pages are recorded (the hook of
    :mod:`kvasym.render.floatpages`, read before the document) and checked: a page holding one
    float shorter than half the text height and nothing else raises :class:`KvasymError` naming
    the page and the float, unless ``allow_single_float_pages``."""
    main = Path(main_tex)
    if not main.is_file():
        raise KvasymError(f"{main}: no such LaTeX file")
    if not have_latex():
        raise KvasymError(f"no LaTeX engine (latexmk, pdflatex) found; Debian: apt-get install {LATEX_PACKAGES}")
    folder = main.parent / out_dir
    hook = write_hook(folder)
    # the hook's path as the engine sees it from the main file's folder (latexmk -cd); the job
    # keeps the main file's name (latexmk would otherwise name it after the first file read)
    hook_tex = hook.resolve().as_posix() if Path(out_dir).is_absolute() else f"{Path(out_dir).as_posix()}/{hook.name}"
    command = ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", f"-outdir={out_dir}",
               f"-jobname={main.stem}", f"-usepretex=\\input{{{hook_tex}}}", "-cd", str(main)]
    env = {**os.environ, "max_print_line": str(UNWRAPPED_LINE)}
    done = subprocess.run(command, check=False, env=env)
    pdf = folder / f"{main.stem}.pdf"
    log = folder / f"{main.stem}.log"
    if done.returncode != 0:
        # A run killed while pdflatex wrote main.aux (or latexmk its database) leaves them
        # truncated, and every later run fails on them ("File ended while scanning use of
        # \@writefile") until they are deleted (issue 33, point 4). Build once more from
        # scratch: only a failure of the clean build is the sources' fault.
        removed = clean_auxiliary_files(folder, main.stem)
        print(f"latexmk failed with status {done.returncode}; removed {len(removed)} auxiliary files of "
              f"{folder} and building once more from scratch", flush=True)
        write_hook(folder)
        done = subprocess.run(command, check=False, env=env)
    if done.returncode != 0:
        pdf.unlink(missing_ok=True)  # a PDF left by the failed build would look complete
        raise KvasymError(f"latexmk failed with status {done.returncode} (twice, the second time from a clean "
                          f"build folder); the log is {log}")
    if not allow_overfull:
        check_no_overfull(log)
    if not allow_single_float_pages:
        check_float_pages(folder / f"{main.stem}.fpg", folder / f"{main.stem}.aux")
    print(main_text_report(folder / f"{main.stem}.aux"), flush=True)
    return pdf


def main_text_report(aux_path: str | Path) -> str:
    """One line for the job's log: how many pages come before the appendix (the page of label
    :data:`APPENDIX_LABEL` minus one, references included), the length a reader finishes."""
    aux = Path(aux_path)
    page = label_page(aux.read_text(encoding="utf-8", errors="replace"), APPENDIX_LABEL) if aux.is_file() else None
    if page is None or not page.isdigit():
        return f"main text: unknown length (no label {APPENDIX_LABEL} with an arabic page in {aux})"
    return f"main text: {int(page) - 1} pages before the appendix (page {page})"


def clean_auxiliary_files(folder: Path, stem: str) -> list[Path]:
    """Delete the job's files in the build ``folder`` that a LaTeX run reads back (``<stem>.*``
    but the PDF: .aux, .toc, .out, .fls, .fdb_latexmk, .log, ...); returns them. Nothing else
    in the folder is touched."""
    removed = []
    for path in sorted(Path(folder).glob(f"{stem}.*")):
        if path.suffix != ".pdf" and path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--main", required=True, help="the paper's main LaTeX file (paper/main.tex)")
    parser.add_argument("--out-dir", default="build", help="latexmk's output folder, relative to the main file's")
    parser.add_argument("--allow-overfull", action="store_true",
                        help="keep the PDF even when a line runs into the margin (a draft; the DAG never passes it)")
    parser.add_argument("--allow-single-float-pages", action="store_true",
                        help="keep the PDF even when a page holds one small float alone (a draft; the DAG never "
                             "passes it)")


def run(args: argparse.Namespace) -> None:
    print(build_pdf(args.main, args.out_dir, allow_overfull=args.allow_overfull,
                    allow_single_float_pages=args.allow_single_float_pages))
