"""``numbers.tex``: a macro for every number and name the paper's prose quotes.

The hand-written sources quote only macros, never digits: grid sizes and settings from the
study, the headline cell, formulas, the commit, and per claim its id, statement, threshold and
``where`` fields. Claim macros keep the claim's id as typed in ``config/claims.yaml``: the prose
writes ``\\claim{C2r}{WhereBudget}``, so ``git grep C2r`` finds the claim, its macros and the
paper's sentences (:func:`kvasym.render.claims.claim_macro`).
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..blockq import LLAMA_CPP_TYPES
from ..errors import KvasymError
from ..schemes import get_scheme
from .format import escape_latex
from ..real import HEAD_DIM as REAL_HEAD_DIM
from ..real import REAL_MODEL_NAME
from ..real import REAL_POST_ROPE as REAL_POST
from ..real import REAL_PRE_ROPE as REAL_PRE
from ..real.model_registry import MEMORY_TOKENS, MODELS
from .format import plain

#: Bits a QJL side spends per coordinate (m = d sign bits): the "1" of "(n-1) scalar + 1 QJL".
QJL_BITS = 1
#: The percentile of the ``kl_p99`` column (``numpy.quantile(kl, 0.99)`` in
#: :func:`kvasym.stats.cell_summary`), quoted by the prose as "the 99th percentile".
TAIL_PERCENTILE = 99

#: Formulas the prose typesets (math-mode content). They hold digits, so they live here and
#: not in the hand-written sources, which quote only macros.
FORMULAS: dict[str, str] = {
    "PiHalf": r"\pi/2",
    "TwoPi": r"2\pi",
    "NMinusOne": rf"n-{QJL_BITS}",
    "LogTen": r"\log_{10}",
    "BetaLaw": r"\mathrm{Beta}\bigl((d-1)/2,\,(d-1)/2\bigr)",
    "BetaDensity": r"f(x) \propto (1-x^2)^{(d-3)/2}",
    "BetaMap": r"(x+1)/2",
    "SymInterval": r"[-1, 1]",
    "GaussianLimit": r"\mathcal{N}(0, 1/d)",
    "SphereDim": r"d-1",
    "JensenIneq": r"\mathbb{E}[e^{\ell+e}] = e^{\ell}\,\mathbb{E}[e^{e}] > e^{\ell}",
    "QJLReconstruction": r"\hat r = \frac{\sqrt{\pi/2}}{m}\,\lVert r\rVert\, S^{\top}\operatorname{sign}(S r)",
    "QJLVariance": r"\operatorname{Var}\langle q, \hat r\rangle \approx "
                   r"\frac{\pi}{2}\,\frac{\lVert r\rVert^{2}\lVert q\rVert^{2}}{m}",
    "QJLRatioResidual": r"\pi/2 - 1/d",
    "QJLRatioNbit": r"(\pi/2 - 1/d)\,D(n-1)/D(n)",
    "CodebookRatioLimit": r"D(n-1)/D(n) \to 4",
    # the orthogonal (hadamard) sketch of kvasym.sketch: error energies and the ratio of claim C1h
    "QJLEnergy": r"(\pi/2 - 1/d)\,\lVert r\rVert^{2}",
    "HadamardEnergy": r"(\pi/2 - 1 + O(1/d))\,\lVert r\rVert^{2}",
    "HadamardRatioNbit": r"(\pi/2 - 1 + O(1/d))\,D(n-1)/D(n)",
    "HadamardRatioLimit": r"4(\pi/2 - 1)",
    "OneBit": rf"{QJL_BITS}",
    "LogitDef": r"\ell = s\, q K^{\top}/\sqrt{d}",
    "SNRDef": r"\mathrm{SNR} = \lVert x\rVert^{2}/\lVert x-\hat x\rVert^{2}",
    "ShannonBits": r"\tfrac{1}{2}\log_{2}\mathrm{SNR}",
    "EpsDirDef": r"\varepsilon_{\mathrm{dir}} = 1-\cos\varphi",
    "RecallDef": r"\lvert \mathrm{top}_k(p)\cap \mathrm{top}_k(\hat p)\rvert / k",
    # the query models of kvasym.querymodel (issue 14, point 1)
    "AlignmentDef": r"a = q^{\top} C_K\, q \,/\, (\lVert q\rVert^{2} \operatorname{tr} C_K / d)",
    "SubspaceAlignment": r"a = d/r",
    "QueryNormAtAlignment": r"\lVert q\rVert^{2} = d^{2}/(a \operatorname{tr} C_K)",
    "InverseAlignment": r"1/a",
    "IsotropicAlignment": r"\mathrm{E}[a] = 1",
    "UnitAlignment": r"a = 1",
    "SubspaceShrink": r"r/d",
    "IsotropicInverseAlignment": r"\mathrm{E}[1/a] = r(d-2)/(d(r-2))",
    "RankAtMostTwo": r"r \le 2",
}


def _default_level() -> float:
    from .. import stats

    return float(inspect.signature(stats.bootstrap_ratio_ci).parameters["level"].default)


def numbers_slice(
    study: Any,
    headline: Mapping[str, Any],
    claims: Sequence[Mapping[str, Any]] = (),
    *,
    commit: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Everything ``numbers.tex`` depends on, as a JSON-able dict (a Snakemake params value:
    it changes, the macros are rewritten). ``claims``: :func:`kvasym.claims.load_claims`'s list.
    ``commit``/``version`` default to the checkout's git commit and the package version."""
    from .. import __version__
    from ..dataset import git_commit

    return {
        "distributions": [
            {**study.distributions[n].to_dict(), "dims": list(study.distribution_dims[n])} for n in study.distributions
            if n not in getattr(study, "query_variants", {})
        ],
        # the query models swept over the low-rank distributions (config key query_models)
        "query_models": list(dict.fromkeys(v["query"] for v in getattr(study, "query_variants", {}).values())),
        "schemes": list(study.schemes),
        # the synthetic distributions the frontier's own schemes run on (config key frontier)
        "frontier_distributions": list(getattr(study, "frontier_distributions", ())),
        "budgets": list(study.budgets),
        "sharpness": list(study.sharpness),
        "trials": study.trials,
        "n_queries": study.n_queries,
        "seq_len": study.seq_len,
        # the sequence-length sweep (config key seq_len_sweep), resolved; {} without one
        "seq_len_sweep": dict(getattr(study, "seq_len_sweep", {}) or {}),
        "per_key_trials": study.per_key_trials,
        "base_seed": study.base_seed,
        "norm_dtype": study.norm_dtype,
        "stats": dict(study.stats),
        "theory": dict(study.theory),
        "headline": dict(headline),
        # the claims' significance level (the claims file's defaults.alpha)
        "alpha": next((float(c["where"]["alpha"]) for c in claims if "alpha" in (c.get("where") or {})), 0.05),
        "claims": [
            {"id": str(c["id"]), "statement": str(c.get("statement", "")), "holds_if": dict(c.get("holds_if") or {}),
             "where": dict(c.get("where") or {})}
            for c in claims
        ],
        "commit": commit if commit is not None else git_commit(),
        "version": version if version is not None else __version__,
    }


def _seq_len_sweep_macros(sweep: Mapping[str, Any]) -> dict[str, str]:
    """The sweep's distribution, shortest and longest caches (keys) and their ratio; n/a without a sweep."""
    lengths = [int(x) for x in sweep.get("seq_lens", [])]
    if not lengths:
        return {key: "n/a" for key in ("SeqLenSweepDistribution", "SeqLenSweepMin", "SeqLenSweepMax",
                                       "SeqLenSweepFold")}
    return {"SeqLenSweepDistribution": escape_latex(str(sweep["distribution"])),
            "SeqLenSweepMin": plain(min(lengths)), "SeqLenSweepMax": plain(max(lengths)),
            "SeqLenSweepFold": plain(max(lengths) / min(lengths))}


def _join(values: Sequence[Any]) -> str:
    return ", ".join(plain(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else escape_latex(str(v))
                     for v in values)


def _camel(key: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in key.replace("-", "_").split("_") if part).translate(
        {ord(c): None for c in "0123456789."}
    )


_OPS = {">=": r"$\geq$", ">": "$>$", "<=": r"$\leq$", "<": "$<$", "all": "all cells",
        "within": r"within $\pm$"}


def numbers_macros(slice_: Mapping[str, Any]) -> dict[str, str]:
    """Macro name -> LaTeX body (already escaped) of every number/name the prose quotes."""
    from .claims import claim_macro
    from ..metrics import ROUTING_TOPK
    from ..waterfill import MAX_WIDTH_BITS

    dists = slice_["distributions"]
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for d in dists:
        by_kind.setdefault(d["kind"], []).append(d)
    dims = list(dict.fromkeys(dim for d in dists for dim in d["dims"]))
    nus = sorted(float(d["params"]["nu"]) for d in by_kind.get("student_t", []))
    ranks = sorted(int(d["params"]["rank"]) for d in by_kind.get("low_rank", []))
    outliers = by_kind.get("concentrated", [])
    n_data_cells = sum(len(d["dims"]) for d in dists)
    headline = slice_["headline"]
    commit = str(slice_["commit"])
    m: dict[str, str] = {
        "NumDistributions": str(len(dists)),
        "DistributionList": _join([d["name"] for d in dists]),
        "NumDataCells": str(n_data_cells),
        "NumSchemes": str(len(slice_["schemes"])),
        "SchemeList": _join(slice_["schemes"]),
        "NumBudgets": str(len(slice_["budgets"])),
        "GridBudgets": _join(slice_["budgets"]),
        "BudgetMin": str(min(slice_["budgets"])),
        "BudgetMax": str(max(slice_["budgets"])),
        "NumDims": str(len(dims)),
        "GridDims": _join(dims),
        "NumSharpness": str(len(slice_["sharpness"])),
        "GridSharpness": _join(slice_["sharpness"]),
        "NumTrials": str(slice_["trials"]),
        "NumQueries": str(slice_["n_queries"]),
        "SeqLen": str(slice_["seq_len"]),
        **_seq_len_sweep_macros(slice_.get("seq_len_sweep") or {}),
        "QueriesPerCell": str(slice_["trials"] * slice_["n_queries"]),
        "NumCells": str(n_data_cells * len(slice_["schemes"]) * len(slice_["budgets"])),
        "NumPairs": str(len(slice_["schemes"]) * (len(slice_["schemes"]) - 1) // 2),
        "PerKeyTrials": str(slice_["per_key_trials"]),
        "NBoot": str(slice_["stats"]["n_boot"]),
        "NPermutations": str(slice_["stats"]["n_permutations"]),
        "EnergyMaxN": str(slice_["stats"]["energy_max_n"]),
        "TheoryTrials": str(min(slice_["theory"]["trials"], slice_["trials"])),
        "TheoryProbes": str(slice_["theory"]["n_probes"]),
        "TheoryBoot": str(slice_["theory"]["n_boot"]),
        "BaseSeed": str(slice_["base_seed"]),
        "NormDtype": escape_latex(slice_["norm_dtype"]),
        "NumTailDistributions": str(len(nus)),
        "TailNuList": _join(nus) if nus else "n/a",
        "TailNuMin": plain(nus[0]) if nus else "n/a",
        "TailNuMax": plain(nus[-1]) if nus else "n/a",
        "NumLowRankDistributions": str(len(ranks)),
        "RankList": _join(ranks) if ranks else "n/a",
        "FrontierDistributionList": _join(slice_.get("frontier_distributions", [])) or "none",
        "QueryModelList": _join(["subspace", *slice_.get("query_models", [])]),
        "NumConcentratedDistributions": str(len(outliers)),
        "OutlierChannels": _join([d["params"]["n_outliers"] for d in outliers]) if outliers else "n/a",
        "OutlierScale": _join([d["params"]["outlier_scale"] for d in outliers]) if outliers else "n/a",
        "HeadlineDistribution": escape_latex(str(headline["distribution"])),
        "HeadlineDim": str(int(headline["dim"])),
        "HeadlineSharpness": plain(headline["sharpness"]),
        "HeadlineBudget": str(int(headline["budget"])),
        "AlphaLevel": plain(slice_.get("alpha", 0.05)),
        "CILevel": plain(round(100 * _default_level(), 6)) + r"\%",
        "QJLBits": str(QJL_BITS),
        "TopK": str(ROUTING_TOPK),
        "WaterfillMaxBits": str(MAX_WIDTH_BITS),
        "TailPercentile": str(TAIL_PERCENTILE),
        "PiHalfValue": f"{math.pi / 2:.4f}",
        "TwoPiValue": f"{2 * math.pi:.4f}",
        "GitCommit": escape_latex(commit),
        "GitCommitShort": escape_latex(commit[:12]),
        "KvasymVersion": escape_latex(str(slice_["version"])),
        # the real-model rows (kvasym.real): names with digits live here, not in the prose
        "RealModel": escape_latex(REAL_MODEL_NAME),
        "RealHeadDim": str(REAL_HEAD_DIM),
        "RealDistribution": escape_latex(REAL_POST),
        "RealPreRopeDistribution": escape_latex(REAL_PRE),
        # the end-to-end passes (kvasym.real.endtoend): agreement of the argmax, "top-1"
        "TopOne": "1",
        # the second model (kvasym.real.model_registry) and the context the cache memory is counted at
        "SecondModel": escape_latex(MODELS["gemma3-270m"].name),
        "MemoryTokens": str(MEMORY_TOKENS),
        # llama.cpp's cache types (kvasym.blockq): their names and widths, the registry's block
        "LlamaQFour": r"\texttt{q4\_0}",
        "LlamaQFourBits": str(LLAMA_CPP_TYPES["q4_0"][1]),
        "LlamaQEight": r"\texttt{q8\_0}",
        "LlamaQEightBits": str(LLAMA_CPP_TYPES["q8_0"][1]),
        "GgmlBlock": str(get_scheme("GGML-Q0").K.group),
    }
    m.update(FORMULAS)
    for claim in slice_.get("claims", []):
        cid = claim["id"]
        rule = claim.get("holds_if", {})
        fields = {
            "Id": escape_latex(cid),
            "Statement": escape_latex(claim.get("statement", "")),
            "Op": _OPS.get(str(rule.get("op")), escape_latex(str(rule.get("op")))),
            # a 'within' margin is relative: 0.05 reads "within +-5\%" (of the closed form)
            "Threshold": ("n/a" if "value" not in rule else f"{plain(100 * float(rule['value']))}\\%"
                          if rule.get("op") == "within" else plain(rule["value"])),
            "MaxLogP": plain(rule["max_log10_p"]) if "max_log10_p" in rule else "n/a",
            # a 'within' rule's declared target (e.g. the paper's number), when it has one
            "Target": plain(rule["target"]) if "target" in rule else "n/a",
            "MaxP": f"10^{{{plain(rule['max_log10_p'])}}}" if "max_log10_p" in rule else r"\textnormal{n/a}",
        }
        for key, value in claim.get("where", {}).items():
            name = "Where" + _camel(str(key))
            if isinstance(value, bool) or isinstance(value, Mapping):
                continue
            if isinstance(value, (list, tuple)):
                if all(not isinstance(v, (Mapping, list, tuple)) for v in value):
                    fields[name] = _join(value)
            elif isinstance(value, (int, float)):
                fields[name] = plain(value)
            else:
                fields[name] = escape_latex(str(value))
        for field, body in fields.items():
            m[claim_macro(cid, field)] = body
    bad = [k for k in m if not k.isalpha() and not k.startswith("claim:")]
    if bad:
        raise KvasymError(f"macro names must be letters only: {bad}")
    return m


def render_numbers(slice_: Mapping[str, Any], out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/numbers.tex`` (atomically) from :func:`numbers_slice`'s dict; returns
    its path. Each macro is ``\\newcommand``: a clash with a claims macro fails the LaTeX build.
    Claim macros (``claim:<id>:<field>``) are defined through ``\\csname``."""
    from ..atomic import write_text_atomic

    macros = numbers_macros(slice_)
    from .claims import claim_macro_definition

    lines = ["% Generated by the kvasym numbers stage (kvasym.render.numbers): do not edit.", ""]
    for name, body in macros.items():
        if name.startswith("claim:"):
            _, cid, field = name.split(":", 2)
            lines.append(claim_macro_definition(cid, field, body))
        else:
            lines.append(f"\\newcommand{{\\{name}}}{{{body}}}")
    path = Path(out_dir) / "numbers.tex"
    write_text_atomic("\n".join(lines) + "\n", path)
    return path
