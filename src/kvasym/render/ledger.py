"""The ledger's words for people: each claim's test and unit, its rule in mathematics, its order.

A ledger row (``table_claims``) reads: id, claim, test and unit, rule, paper, ours [CI] ("CI
unbounded" for an interval with two infinite ends), verdict with the test it rests on
(:func:`kvasym.claims.decided_by_words`), note. This module writes the three columns the claims
file does not hold as text:

- :func:`test_and_unit`: which estimate and interval the statistic computes, over which
  independent unit (trials of a synthetic distribution, texts of the real model, blocks of
  positions end to end), and how a claim over cells adjusts its p-values (Holm over its own
  cells, :func:`kvasym.claims.evaluate_claims`);
- :func:`rule_math`: the ``holds_if`` rule typeset (``\\geq \\pi/2``, ``\\in 2.25(1 \\pm 10\\%)``,
  ``\\log_{10} p \\le -23``);
- :func:`statement_math`: a claim statement with its formulas typeset (``pi/2`` -> ``\\pi/2``,
  ``>=`` -> ``\\geq``, ``1e-23`` -> ``10^{-23}``, ``n = 4`` in math), escaped otherwise;
- :func:`claim_order`: claims sorted by their number, then their suffix (C1a, C1b, C2, C2b,
  C3, ..., C10, C10e, C10r): the order a reader looks them up in.

Every output is LaTeX (:class:`kvasym.render.format.Latex`); strings from the claims file are
escaped with :func:`kvasym.render.format.escape_latex` before any mathematics is put back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .format import escape_latex
from .format import Latex, plain

__all__ = ["claim_order", "rule_math", "statement_math", "test_and_unit"]

_ID = re.compile(r"^[A-Za-z]*(\d+)(.*)$")


def claim_order(claims: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Claims sorted by (number, suffix) of their id (``C10r`` after ``C10e`` after ``C10``, all
    after ``C9``); ids without a number keep their order after the numbered ones."""

    def key(item: tuple[int, Mapping[str, Any]]) -> tuple[int, int, str, int]:
        position, claim = item
        m = _ID.match(str(claim["id"]))
        if not m:
            return (1, 0, "", position)
        return (0, int(m.group(1)), m.group(2), position)

    return [c for _, c in sorted(enumerate(claims), key=key)]


def _unit(where: Mapping[str, Any], details: Mapping[str, Any]) -> str:
    from ..real.evaluate import REAL_DISTRIBUTIONS

    named = [where.get(k) for k in ("num", "den")] + list(where.get("distributions") or [])
    if where.get("distribution") in REAL_DISTRIBUTIONS and not where.get("num"):
        named.append(where["distribution"])
    return "texts" if any(n in REAL_DISTRIBUTIONS for n in named) else "trials"


_METRIC_WORDS = {"kl": "mean-KL", "t_eps_dir": "output-direction-error", "recall_top5": "top-5-recall"}


def test_and_unit(claim: Mapping[str, Any]) -> Latex:
    """The estimate, its interval and test, and the independent unit, in a few words.

    Parameters
    ----------
    claim : Mapping
        An evaluated claim (``statistic``, ``where``, ``details``).

    Returns
    -------
    Latex
        The statistic's words (:attr:`kvasym.claims.Statistic.describe`) with the claim's unit,
        pairing, metric and theory check filled in; an unknown statistic's name, escaped.
    """
    from ..claims import STATISTICS
    from ..theory import THEORY_CHECK_WORDS

    statistic = str(claim.get("statistic", ""))
    record = STATISTICS.get(statistic)
    if record is None:
        return Latex(escape_latex(statistic))
    where = claim.get("where") or {}
    check = str(where.get("check", ""))
    words = {
        "unit": _unit(where, claim.get("details") or {}),
        "paired": "paired" if where.get("paired") else "unpaired",
        "metric": _METRIC_WORDS.get(str(where.get("metric", "kl")), "metric"),
        # the check's words and its interval's method: kvasym.theory.THEORY_CHECK_WORDS, the one source
        "check": THEORY_CHECK_WORDS[check][0] if check in THEORY_CHECK_WORDS else escape_latex(check),
        "check_interval": THEORY_CHECK_WORDS[check][1] if check in THEORY_CHECK_WORDS else "Fieller",
    }
    return Latex(record.describe.format_map(words))


_OPS = {">=": r"\geq", ">": ">", "<=": r"\leq", "<": "<"}


def rule_math(claim: Mapping[str, Any]) -> Latex:
    """The ``holds_if`` rule in math mode: ``$\\geq 1.57$``, ``$\\in 2.25(1\\pm10\\%)$`` (a target),
    ``$\\in \\theta(1\\pm5\\%)$`` (the closed form), ``all cells``, with ``$\\log_{10} p \\le -23$``
    appended when the rule bounds p."""
    rule = claim.get("holds_if") or {}
    op = str(rule.get("op", ""))
    if op == "all":
        text = "all cells better"
    elif op == "within":
        margin = plain(100 * float(rule["value"]))
        centre = plain(rule["target"]) if "target" in rule else r"\theta"
        text = rf"$\in {centre}\,(1 \pm {margin}\%)$"
    elif op in _OPS and "value" in rule:
        text = rf"${_OPS[op]} {plain(rule['value'])}$"
    else:
        text = escape_latex(op)
    if "max_log10_p" in rule:
        text += rf", $\log_{{10}} p \leq {plain(rule['max_log10_p'])}$"
    return Latex(text)


_POWER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)e(-?\d+)\b")
# formulas of claim statements, applied after escaping (so the patterns see escaped text)
_STATEMENT_MATH: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b2 pi\b"), r"$2\\pi$"),
    (re.compile(r"\bpi/2\b"), r"$\\pi/2$"),
    (re.compile(r"\\textgreater\{\}="), r"$\\geq$"),
    (re.compile(r"\\textless\{\}="), r"$\\leq$"),
    (re.compile(r"\\textgreater\{\}"), r"$>$"),
    (re.compile(r"\\textless\{\}"), r"$<$"),
    (re.compile(r"\(n-1\)"), r"$(n-1)$"),
    (re.compile(r"\bn = (\d+)\b"), r"$n = \1$"),
    (re.compile(r"\bd = (\d+)\b"), r"$d = \1$"),
    (re.compile(r"\bp99\b"), r"99th-percentile"),
    (re.compile(r"(\d+(?:\.\d+)?)x\b"), r"\1$\\times$"),
)


def statement_math(statement: Any) -> Latex:
    """A claim statement escaped for LaTeX with its formulas typeset (see the module doc)."""
    text = escape_latex(str(statement))
    text = _POWER.sub(lambda m: f"${_mantissa(m.group(1))}10^{{{m.group(2)}}}$", text)  # 1e-23
    for pattern, repl in _STATEMENT_MATH:
        text = pattern.sub(repl, text)
    return Latex(text)


def _mantissa(text: str) -> str:
    value = float(text)
    return "" if math.isclose(value, 1.0) else f"{plain(value)}\\times"
