"""The model card's HTML page: one self-contained page of a card (:mod:`kvasym.real.card`).

:func:`render_card_html` draws the card's figures (:func:`card_figures`; the K/V sensitivity and
the allocation with the paper's figure functions, :mod:`kvasym.render.figures.card`), inlines
them as PNG and lays out the recommendations. It reads the card's numbers and computes none. It
lives apart from :mod:`kvasym.real.card` so that the stage measuring a card (``card``) does not
run the drawing code: an edit of the figures' style redraws the page (stage ``card_page``)
without rerunning the card's passes.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..real.card import CARD_FORMAT


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def card_figures(card: Mapping[str, Any]) -> dict[str, Any]:
    """The card's matplotlib figures by name: ``heads`` (heat maps of the per-head statistics),
    ``sensitivity`` (K against V per layer), ``allocation`` (widths per layer and side),
    ``frontier`` (mean KL against bits per value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .figures.card import card_allocation, card_sensitivity

    heads = pd.DataFrame(card["heads"])
    figures = {}
    panels = [("key_mean_share", "key mean share (post-RoPE)"), ("key_mean_share_pre", "key mean share (pre-RoPE)"),
              ("key_outlier_channels", "key outlier channels"), ("sink_mass", "attention on position 0")]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.2), constrained_layout=True)
    for ax, (column, title) in zip(axes, panels):
        grid = heads.pivot(index="kv_head", columns="layer", values=column)
        image = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="viridis")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylabel("KV head")
        fig.colorbar(image, ax=ax, shrink=0.8)
    figures["heads"] = fig

    # the paper's drawings of the same tables (figure family card)
    figures["sensitivity"] = card_sensitivity(pd.DataFrame(card["layer_sensitivity"]), model=str(card["model"]["name"]))
    figures["allocation"] = card_allocation(pd.DataFrame(card["allocation"]), model=str(card["model"]["name"]))

    front = pd.DataFrame(card["frontier"])
    fig, ax = plt.subplots(figsize=(6.5, 3.2), constrained_layout=True)
    for scheme, rows in front.groupby("scheme", sort=True):
        rows = rows.sort_values("bits_per_coordinate")
        ax.plot(rows["bits_per_coordinate"], rows["kl_mean"], "-o", ms=3, label=str(scheme))
    ax.set_yscale("log")
    ax.set_xlabel("bits per value (measured)")
    ax.set_ylabel("mean next-token KL (nats)")
    ax.legend(fontsize=7, ncol=2)
    figures["frontier"] = fig
    return figures


def render_card_html(card: Mapping[str, Any]) -> str:
    """One self-contained HTML page of ``card`` (figures inlined as PNG data)."""
    images = {name: _png(fig) for name, fig in card_figures(card).items()}
    model = card["model"]
    esc = html.escape

    def fmt(value: Any, digits: int = 3) -> str:
        return "–" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else esc(str(value))

    rec_rows = []
    for rec in card["recommendations"]:
        pair = rec["allocation_vs_uniform"] or {}
        rec_rows.append(
            f"<tr><td>{rec['budget']}</td><td>{fmt(rec['rate'], 4)}</td><td><b>{esc(rec['scheme'])}</b> "
            f"(n={rec['scheme_budget']})</td><td>{fmt(rec['bits_per_coordinate'], 4)}</td>"
            f"<td>{fmt(rec['kl_mean'])} [{fmt(rec['kl_mean_low'])}, {fmt(rec['kl_mean_high'])}]</td>"
            f"<td>{fmt(rec['ppl_ratio'], 4)}</td>"
            f"<td>{fmt(pair.get('kl_ratio'))} [{fmt(pair.get('kl_ratio_low'))}, {fmt(pair.get('kl_ratio_high'))}]"
            f"</td><td>{fmt(pair.get('log10_p'))}</td></tr>")
    settings = card["settings"]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>KV-cache card: {esc(str(model.get('name')))}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto;font-size:14px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
img{{max-width:100%}}</style></head><body>
<h1>KV-cache card: {esc(str(model.get('name')))}</h1>
<p>{esc(str(model.get('architecture')))}, {model.get('n_layers')} layers, {model.get('n_heads')} query heads,
{model.get('n_kv_heads')} KV heads of dimension {model.get('head_dim')}; file {esc(str(model.get('file')))}
(SHA-256 {esc(str(model.get('sha256'))[:16])}…). Calibration texts: {esc(', '.join(settings['calibration_texts']))};
evaluation texts: {esc(', '.join(settings['evaluation_texts']))}; {settings['tokens']} tokens each;
reference scheme {esc(card['settings']['reference'])}, widths {settings['widths']}, units
{esc(settings['granularity'])}.</p>
<h2>Recommendation per budget</h2>
<p>Lowest measured mean next-token KL among the options whose measured bits per value do not exceed the uniform
reference's at that budget; the last columns compare the measured allocation with the uniform reference on
the evaluation texts (geometric-mean KL ratio with its 95% interval over (text, draw) units; Wilcoxon log10 p).</p>
<table><tr><th>n</th><th>rate</th><th>choice</th><th>bits/value</th><th>mean KL [95% CI]</th><th>PPL ratio</th>
<th>allocation / uniform KL</th><th>log10 p</th></tr>{''.join(rec_rows)}</table>
<h2>The cache, per layer and KV head</h2><img src="{images['heads']}" alt="per-head statistics">
<h2>Sensitivity of K and V, one layer at a time</h2><img src="{images['sensitivity']}" alt="sensitivity">
<h2>Measured allocation</h2><img src="{images['allocation']}" alt="allocation">
<h2>Measured frontier</h2><img src="{images['frontier']}" alt="frontier">
<p>Generated by kvasym ({esc(CARD_FORMAT)}); every number is in the card's JSON.</p>
</body></html>
"""
