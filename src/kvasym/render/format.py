"""The one number formatter of the paper, its tables, the claims ledger and figure labels.

Every number the project prints goes through :func:`sig` (significant figures; LaTeX math
content) or :func:`sig_text` (the same digits as plain text, for Markdown, HTML and figure
labels): ``0.054894 -> 0.0549``, ``2 -> 2.00``, ``0.000457 -> 4.57\\times10^{-4}`` /
``4.57×10^-4``. p-values go through :func:`pvalue` (from their log10, so a p that underflowed
to 0 still prints) or :func:`pvalue_text`.

Templates live in ``kvasym/templates/*.tex.j2`` and use LaTeX-safe delimiters:

- ``\\VAR{expr}`` prints an expression, ``\\BLOCK{for ...}`` ... ``\\BLOCK{endfor}`` are statements,
  ``\\#{ a comment }`` is a template comment (no line statements, so ``%%`` stays a LaTeX comment);
- undefined variables raise (:class:`jinja2.StrictUndefined`);
- nothing is HTML-escaped (``autoescape=False``), but every value printed by ``\\VAR{}`` goes
  through :func:`_finalize`: a plain ``str`` (a name from the config, a claim statement, a
  verdict) is escaped with :func:`escape_latex`; only :class:`Latex` strings, which the number
  filters and the explicit ``escape`` filter return, are printed as they are; a
  float that no number filter formatted is an error. So no string from config or data can
  reach the output unescaped, even if a template forgets ``|escape``.

Number filters: :func:`sig`, :func:`num` (a table cell, math mode, optional bold),
:func:`pvalue`, :func:`ci` (estimate [low, high]), :func:`bits` (payload + side),
:func:`plain` (a config value as typed), :func:`count`, :func:`mediqr`.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import jinja2
import numpy as np
import pandas as pd

from ..errors import KvasymError

__all__ = ["BREAK_AFTER", "DIGITS", "FILTERS", "Latex", "P_DECIMAL_MIN", "best_flags", "bits", "ci", "ci_text",
           "ci_wrap", "count", "environment", "escape", "escape_breakable", "escape_latex", "escape_latex_breakable",
           "mediqr", "num", "plain", "pvalue", "pvalue_raw", "pvalue_text", "render_template", "sig", "sig_text"]

#: LaTeX's special characters and what typesets each literally.
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


TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
#: Significant figures of every printed estimate.
DIGITS = 3
#: p >= this is printed as a decimal, smaller p in scientific notation.
P_DECIMAL_MIN = 0.01


class Latex(str):
    """A string that is already valid LaTeX (formatted numbers, escaped text): printed as is."""


# --------------------------------------------------------------------------------------------
# number formatting
# --------------------------------------------------------------------------------------------


def _missing(x: Any) -> bool:
    if x is None:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def best_flags(values: Sequence[Any], better: str) -> list[bool]:
    """Which entries are the best (``lower`` or ``higher``) of ``values``; ties are all best,
    missing values never are, and a column with one usable value has no best."""
    if better not in ("lower", "higher"):
        raise KvasymError(f"better must be 'lower' or 'higher', got {better!r}")
    arr = np.array([np.nan if _missing(v) else float(v) for v in values], dtype=float)
    ok = np.isfinite(arr)
    if ok.sum() < 2:
        return [False] * len(arr)
    target = np.min(arr[ok]) if better == "lower" else np.max(arr[ok])
    return [bool(o and v == target) for o, v in zip(ok, arr)]


def _fixed(x: float, digits: int) -> str:
    """``x`` rounded to ``digits`` significant figures, trailing zeros kept (0.05 -> 0.0500)."""
    exponent = math.floor(math.log10(abs(x)))
    rounded = round(x, digits - 1 - exponent)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) != exponent:  # 9.996 -> 10.0
        exponent += 1
        rounded = round(x, digits - 1 - exponent)
    decimals = max(digits - 1 - exponent, 0)
    return f"{rounded:.{decimals}f}"


def _scientific(mantissa_log10: float, digits: int) -> tuple[str, int]:
    """(mantissa text, exponent) of 10**mantissa_log10 with ``digits`` significant figures."""
    exponent = math.floor(mantissa_log10)
    mantissa = round(10 ** (mantissa_log10 - exponent), digits - 1)
    if mantissa >= 10:
        mantissa /= 10
        exponent += 1
        mantissa = round(mantissa, digits - 1)
    return f"{mantissa:.{digits - 1}f}", exponent


def sig(x: Any, digits: int = DIGITS) -> Latex:
    """``x`` to ``digits`` significant figures, as math-mode content (no ``$``).

    Trailing zeros are kept: ``0.054894 -> 0.0549``, ``1.6 -> 1.60``, ``4.0 -> 4.00``,
    ``-0.10677 -> -0.107``. Scientific notation for ``|x| >= 1e4`` or ``|x| < 1e-3``:
    ``123456 -> 1.23\\times10^{5}``, ``0.000123 -> 1.23\\times10^{-4}``. ``0 -> 0``, NaN or
    None -> ``n/a``.
    """
    if _missing(x):
        return Latex("n/a")
    x = float(x)
    if math.isinf(x):
        return Latex("\\infty" if x > 0 else "-\\infty")
    if x == 0:
        return Latex("0")
    if digits < 1:
        raise KvasymError(f"sig: digits must be >= 1, got {digits}")
    if 1e-3 <= abs(x) < 1e4:
        text = _fixed(x, digits)
        if abs(float(text)) < 1e4:
            return Latex(text)
    mantissa, exponent = _scientific(math.log10(abs(x)), digits)
    return Latex(f"{'-' if x < 0 else ''}{mantissa}\\times10^{{{exponent}}}")


def sig_text(x: Any, digits: int = DIGITS) -> str:
    """:func:`sig` as plain text (Markdown, HTML, figure labels): the same digits, with
    ``×10^`` for the power of ten: ``0.000123 -> 1.23×10^-4``, ``2 -> 2.00``, missing -> ``n/a``."""
    return _as_text(str(sig(x, digits)))


def _as_text(math: str) -> str:
    """Math-mode content of :func:`sig` or :func:`pvalue` as plain text (the same digits)."""
    if "\\times10^" in math:
        mantissa, exponent = math.split("\\times10^")
        return f"{mantissa}×10^{exponent.strip('{}')}"
    return {"\\infty": "inf", "-\\infty": "-inf"}.get(math, math)


def plain(x: Any) -> Latex:
    """A config value as typed: integers without a decimal point (2.0 -> 2), others as %g."""
    if _missing(x):
        return Latex("n/a")
    if isinstance(x, (bool, np.bool_)):
        raise KvasymError(f"plain: a boolean is not a number: {x!r}")
    x = float(x)
    return Latex(str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}")


def num(x: Any, digits: int = DIGITS, bold: bool = False) -> Latex:
    """A table cell: ``$0.0549$``, ``$\\mathbf{0.0549}$`` when ``bold``, ``--`` when missing."""
    if _missing(x):
        return Latex("--")
    text = sig(x, digits)
    return Latex(f"$\\mathbf{{{text}}}$" if bold else f"${text}$")


def count(x: Any) -> Latex:
    """An integer count."""
    if _missing(x):
        return Latex("--")
    if float(x) != int(x):
        raise KvasymError(f"count: {x!r} is not an integer")
    return Latex(str(int(x)))


def pvalue(log10_p: Any, digits: int = 1) -> Latex:
    """A p-value from its log10, as a math-mode cell.

    ``-30.4 -> $4\\times10^{-31}$`` (10**-30.4 = 3.98e-31), ``-0.4325 -> $0.37$``, ``0 -> $1$``;
    computed from the logarithm, so a p that underflowed to 0 in floating point still renders
    (``-400.2 -> $6\\times10^{-401}$``). ``-inf`` -> ``$0$`` (an exact zero), missing -> ``--``.
    """
    if _missing(log10_p):
        return Latex("--")
    lp = min(float(log10_p), 0.0)
    if math.isinf(lp):
        return Latex("$0$")
    if lp >= math.log10(P_DECIMAL_MIN):
        p = 10**lp
        return Latex(f"${'1' if p >= 0.995 else f'{p:.2g}'}$")
    mantissa, exponent = _scientific(lp, digits)
    return Latex(f"${mantissa}\\times10^{{{exponent}}}$")


def pvalue_raw(p: Any, digits: int = 1) -> Latex:
    """:func:`pvalue` of a p given on the linear scale."""
    if _missing(p):
        return Latex("--")
    return pvalue(math.log10(p) if p > 0 else -math.inf, digits)


def pvalue_text(log10_p: Any, digits: int = 1) -> str:
    """:func:`pvalue` as plain text: ``-30.4 -> 4×10^-31``, ``-0.4325 -> 0.37``, missing -> ``n/a``."""
    if _missing(log10_p):
        return "n/a"
    return _as_text(str(pvalue(log10_p, digits)).strip("$"))


def _unbounded(low: Any, high: Any) -> bool:
    """Both ends of an interval infinite: an unbounded set (e.g. Fieller's when the denominator's
    mean is not significantly different from 0), which is printed as a word, not as bounds."""
    return math.isinf(float(low)) and math.isinf(float(high))


def _bounds(low: Any, high: Any, digits: int, sep: str = ", ") -> str:
    """Math-mode content of an interval: ``[5.32, 6.03]``; an infinite end is open,
    ``[5.32, \\infty)``, ``(-\\infty, 6.03]``."""
    left = "(" if math.isinf(float(low)) else "["
    right = ")" if math.isinf(float(high)) else "]"
    return f"{left}{sig(low, digits)}{sep}{sig(high, digits)}{right}"


def ci(estimate: Any, low: Any = None, high: Any = None, digits: int = DIGITS, bold: bool = False) -> Latex:
    """``$5.60\\ [5.32, 6.03]$``; the interval is left out when missing, ``$5.60$ (CI unbounded)``
    when both its ends are infinite (never ``[-\\infty, \\infty]`` as if it were a measurement)."""
    if _missing(estimate):
        return Latex("--")
    est = sig(estimate, digits)
    est = Latex(f"\\mathbf{{{est}}}") if bold else est
    if _missing(low) or _missing(high):
        return Latex(f"${est}$")
    if _unbounded(low, high):
        return Latex(f"${est}$ (CI unbounded)")
    return Latex(f"${est}\\ {_bounds(low, high, digits)}$")


#: The separator of :func:`ci_wrap`'s bounds: a permitted line break after the comma.
_WRAP_SEP = ",\\allowbreak "


def ci_wrap(estimate: Any, low: Any = None, high: Any = None, digits: int = DIGITS) -> Latex:
    """:func:`ci` for a narrow column: ``$5.60$ $[5.32,\\allowbreak 6.03]$``, the estimate and the
    interval as two math groups, so the line may break between them, and inside the interval
    after its comma (two negative bounds of three digits are wider than a narrow column);
    ``$5.60$ (CI unbounded)`` when both ends are infinite."""
    if _missing(estimate):
        return Latex("--")
    est = sig(estimate, digits)
    if _missing(low) or _missing(high):
        return Latex(f"${est}$")
    if _unbounded(low, high):
        return Latex(f"${est}$ (CI unbounded)")
    return Latex(f"${est}$ ${_bounds(low, high, digits, sep=_WRAP_SEP)}$")


def interval(low: Any, high: Any, digits: int = DIGITS) -> Latex:
    """An interval alone, for a column beside an estimate that already has one: ``$[5.32, 6.03]$``;
    ``--`` when missing, ``unbounded`` when both ends are infinite."""
    if _missing(low) or _missing(high):
        return Latex("--")
    if _unbounded(low, high):
        return Latex("unbounded")
    return Latex(f"${_bounds(low, high, digits)}$")


def ci_text(low: Any, high: Any, digits: int = DIGITS) -> str:
    """An interval as plain text (Markdown, HTML): ``[5.32, 6.03]`` with :func:`sig_text`'s
    digits, ``unbounded`` when both ends are infinite, ``[5.32, inf)`` when one is, "" when
    missing."""
    if _missing(low) or _missing(high):
        return ""
    if _unbounded(low, high):
        return "unbounded"
    left = "(" if math.isinf(float(low)) else "["
    right = ")" if math.isinf(float(high)) else "]"
    return f"{left}{sig_text(low, digits)}, {sig_text(high, digits)}{right}"


def bits(payload: Any, side: Any) -> Latex:
    """Measured bits per coordinate, payload + side information: ``$4 + 0.25$``."""
    if _missing(payload) or _missing(side):
        return Latex("--")
    return Latex(f"${float(payload):.3g} + {float(side):.3g}$")


def mediqr(median: Any, iqr: Any, digits: int = DIGITS) -> Latex:
    """A median with its interquartile range in small type: ``$114$ {\\scriptsize($0.118$)}``;
    the range is left out when missing, ``--`` when the median is."""
    if _missing(median):
        return Latex("--")
    if _missing(iqr):
        return Latex(f"${sig(median, digits)}$")
    return Latex(f"${sig(median, digits)}$ {{\\scriptsize(${sig(iqr, digits)}$)}}")


def escape(value: Any) -> Latex:
    """The ``escape`` filter: any value as literal text."""
    return value if isinstance(value, Latex) else Latex(escape_latex(str(value)))


def escape_breakable(value: Any) -> Latex:
    """The ``escape_breakable`` filter: literal text that may break inside its long tokens
    (:func:`escape_latex_breakable`), for a narrow column's generated messages."""
    return value if isinstance(value, Latex) else Latex(escape_latex_breakable(str(value)))


def _finalize(value: Any) -> Any:
    """Applied to every ``\\VAR{}``: escape plain strings, refuse unformatted floats."""
    if isinstance(value, Latex):
        return value
    if isinstance(value, str):
        return escape_latex(value)
    if isinstance(value, (bool, np.bool_)):
        raise KvasymError(f"template printed a boolean ({value!r}); format it explicitly")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        raise KvasymError(f"template printed an unformatted number {value!r}; "
                          "use a number filter (sig, num, plain, ...)")
    if value is None:
        raise KvasymError("template printed None; format it with a filter that handles missing values")
    return escape_latex(str(value))


FILTERS = {
    "escape": escape,
    "e": escape,
    "escape_breakable": escape_breakable,
    "sig": sig,
    "num": num,
    "ci_wrap": ci_wrap,
    "interval": interval,
    "plain": plain,
    "count": count,
    "pvalue": pvalue,
    "pvalue_raw": pvalue_raw,
    "ci": ci,
    "bits": bits,
    "mediqr": mediqr,
}


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The jinja2 environment of the LaTeX templates (see the module docstring)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        block_start_string="\\BLOCK{",
        block_end_string="}",
        variable_start_string="\\VAR{",
        variable_end_string="}",
        comment_start_string="\\#{",
        comment_end_string="}",
        line_statement_prefix=None,
        line_comment_prefix=None,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
    )
    env.filters.update(FILTERS)
    return env


def render_template(name: str, **context: Any) -> str:
    """Render one template of ``kvasym/templates`` (missing variables raise)."""
    return environment().get_template(name).render(**context)
