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


#: Characters after which :func:`escape_latex_breakable` lets a line break: the joints of the
#: long tokens a generated message holds (``distribution=lowrank8+isotropic``,
#: ``seq_len_sweep.seq_lens``, a path), which a narrow table column cannot otherwise break.
BREAK_AFTER = frozenset("=+/_,;:")


def escape_latex_breakable(text: str) -> str:
    """:func:`escape_latex`, with a permitted line break (``\\allowbreak{}``) after each
    character of :data:`BREAK_AFTER` and after a ``.`` between two letters (a config key's
    path, not a decimal point). Deleting every ``\\allowbreak{}`` gives ``escape_latex(text)``."""
    text = str(text)
    out = []
    for i, ch in enumerate(text):
        out.append(_SPECIALS.get(ch, ch))
        if ch in BREAK_AFTER or (ch == "." and 0 < i < len(text) - 1 and text[i - 1].isalpha()
                                 and text[i + 1].isalpha()):
            out.append(r"\allowbreak{}")
    return "".join(out)
