"""LaTeX helpers: escaping every string that comes from config or data."""

from __future__ import annotations

_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


def escape_latex(text: str) -> str:
    """Escape LaTeX's special characters so any name or message typesets literally."""
    return "".join(_SPECIALS.get(ch, ch) for ch in str(text))
