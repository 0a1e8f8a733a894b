"""Reading a LaTeX log: the overfull boxes of a build, with the file and lines they come from.

A typeset page must not run into its margins. TeX reports every line it could not fit as

    Overfull \\hbox (43.2pt too wide) in paragraph at lines 12--15
    Overfull \\hbox (3.1pt too wide) in alignment at lines 40--58

and keeps a stack of the files it reads in parentheses: ``(./generated/table_tests.tex`` opens
a file, the matching ``)`` closes it. :func:`overfull_boxes` walks that stack, so each box is
named by the source file that holds it (the log must not be wrapped: the paper stage runs TeX
with ``max_print_line`` = :data:`UNWRAPPED_LINE`, :mod:`kvasym.stages.paper`).
:func:`check_no_overfull` is the paper stage's gate: any overfull horizontal box fails the build
with one line per box.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import KvasymError

__all__ = ["UNWRAPPED_LINE", "OverfullBox", "check_no_overfull", "overfull_boxes"]

#: TeX's ``max_print_line`` for the paper build: long enough that no file name is wrapped.
UNWRAPPED_LINE = 100000

_OVERFULL = re.compile(r"Overfull \\hbox \((?P<pt>[0-9.]+)pt too wide\) (?P<where>.*?)(?:\s*$)", re.M)
# a file opened in the log: "(" then a path-like token with an extension, up to space or parens
_OPEN = re.compile(r"\((?P<path>(?:[A-Za-z]:)?[./~]?[^\s(){}]*?\.[A-Za-z0-9]{1,8})(?=[\s()]|$)")


@dataclass(frozen=True)
class OverfullBox:
    """One overfull ``\\hbox``: how far it sticks out (pt), TeX's location phrase (``in
    paragraph at lines 12--15``), the source file it was read from (``?`` when unknown) and
    the text of the box as TeX prints it (its first line)."""

    overflow_pt: float
    where: str
    source: str
    text: str

    def __str__(self) -> str:
        shown = f": {self.text}" if self.text else ""
        return f"Overfull \\hbox ({self.overflow_pt:.1f}pt too wide) {self.where} of {self.source}{shown}"


def overfull_boxes(log: str) -> list[OverfullBox]:
    """Every overfull horizontal box of a LaTeX log, in log order, each with the file that
    was open (innermost) when TeX reported it. Parentheses inside the box text TeX prints
    after the report are not counted as files (that text is skipped)."""
    boxes: list[OverfullBox] = []
    stack: list[str] = []
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        hit = _OVERFULL.search(line)
        if hit:
            # the box's text: the next non-empty line (TeX prints it, then a [] line)
            text = ""
            j = i + 1
            while j < len(lines) and lines[j].strip() == "":
                j += 1
            if j < len(lines) and not lines[j].startswith(("Overfull", "Underfull")):
                text = lines[j].strip()[:120]
                # skip the box's printed content up to the blank line that ends it
                while j < len(lines) and lines[j].strip() != "":
                    j += 1
                i = j
            else:
                i += 1
            boxes.append(OverfullBox(float(hit["pt"]), hit["where"].strip(), _innermost_file(stack), text))
            continue
        _walk_parens(line, stack)
        i += 1
    return boxes


def _walk_parens(line: str, stack: list[str]) -> None:
    """Update the open-file stack with one log line's parentheses."""
    pos = 0
    while pos < len(line):
        ch = line[pos]
        if ch == "(":
            m = _OPEN.match(line, pos)
            if m:
                stack.append(m["path"])
                pos = m.end()
                continue
            stack.append("")  # a parenthesis that is not a file: closed by its own ")"
        elif ch == ")" and stack:
            stack.pop()
        pos += 1


def _innermost_file(stack: list[str]) -> str:
    for entry in reversed(stack):
        if entry:
            return entry
    return "?"


def check_no_overfull(log_path: str | Path) -> None:
    """Raise :class:`KvasymError` listing every overfull ``\\hbox`` of the LaTeX log at
    ``log_path`` (its size, lines and source file); return silently when there is none."""
    path = Path(log_path)
    if not path.is_file():
        raise KvasymError(f"{path}: no LaTeX log to check for overfull boxes")
    boxes = overfull_boxes(path.read_text(encoding="latin-1"))
    if boxes:
        listed = "\n  ".join(str(b) for b in boxes)
        raise KvasymError(f"{path}: {len(boxes)} overfull box(es); the paper must fit its margins:\n  {listed}")
