"""Mixed-precision caches: a bit width per layer, K/V side and KV head, measured end to end.

A *width map* ``widths`` is an int array (n_layers, 2, n_kv_heads): ``widths[l, s, h]`` is how
layer ``l``'s side ``s`` (0 = K, 1 = V) of KV head ``h`` is stored:

- ``0``: not quantized (full precision; only in sensitivity passes, never in an allocation);
- ``1..8``: the scheme's side at that budget ``n`` (:func:`kvasym.evaluate.quantize_pair` with
  identity ``(seed_text, l, h)``, the end-to-end passes' identity, so a uniform map of width
  ``n`` is RKV's (or the scheme's) all-layer end-to-end pass at ``n`` bit for bit);
- ``16`` (:data:`FLOAT16_WIDTH`): the rows rounded to float16 (16 bits per value, no side).

The pass (:func:`mixed_forward`) is :func:`kvasym.real.endtoend.run_layers`'s, reading each
layer's cache through its map: keys stored after RoPE, every position reading its own key and
value exactly (``own="exact"``, a decoder step's read).

Units, sensitivity and the additive model
    A *unit* is a set of cells of the map that share one width: a whole layer (``"layer"``), a
    layer's side (``"layer_side"``), or one KV head's side (``"layer_side_head"``)
    (:func:`unit_cells`). The sensitivity of unit ``u`` at width ``b`` (:func:`sensitivity`) is
    the mean over positions of the next-token KL of the pass with ``u`` alone at ``b`` (the
    rest exact), restarted from the reference's residual stream at ``u``'s layer. The
    allocation (:mod:`kvasym.allocation`) predicts the KL of a map by the sum of its units'
    sensitivities; the end-to-end passes of the chosen maps measure whether that holds.

Bits
    A pass reports the mean over its map's cells of each side's measured bits per value
    (payload and side arrays, as :data:`kvasym.real.endtoend.BITS_COLUMNS`), float16 cells at
    16 payload bits; cells not quantized are not counted (sensitivity passes only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import KvasymError
from ..evaluate import dequantize_with, quantize_pair
from ..schemes import MAX_BUDGET, MIN_BUDGET, SIDES, Scheme
from .endtoend import ALL_LAYERS, Reference, draw_seed_text, next_token_metrics
from .gguf_model import GGUFLlama, SequenceFrame
from .jobparts import select_round_robin

#: The width of a unit kept in float16.
FLOAT16_WIDTH = 16
#: Widths a map may hold besides 0 (exact): the schemes' budgets and float16.
WIDTHS = (*range(MIN_BUDGET, MAX_BUDGET + 1), FLOAT16_WIDTH)
GRANULARITIES = ("layer", "layer_side", "layer_side_head")
#: ``kv_head`` of a unit that spans every KV head; ``side`` of one that spans both sides.
ALL_HEADS = -1
BOTH_SIDES = "KV"
#: Columns of a sensitivity table (:func:`sensitivity`), one row per (text, unit, width).
SENSITIVITY_COLUMNS = ("text", "layer", "side", "kv_head", "width", "bits", "kl", "dnll", "top1", "n_positions")


def check_widths(widths: np.ndarray, shape: tuple[int, int, int], what: str = "widths") -> np.ndarray:
    """``widths`` as an int64 array of ``shape`` with every value 0 or in :data:`WIDTHS`."""
    array = np.asarray(widths)
    if array.shape != shape or not np.issubdtype(array.dtype, np.integer):
        raise KvasymError(f"{what} must be an integer array of shape (layers, 2, kv_heads) = {shape}, "
                          f"got {array.shape} {array.dtype}")
    bad = sorted(set(np.unique(array).tolist()) - {0, *WIDTHS})
    if bad:
        raise KvasymError(f"{what} holds widths {bad}; allowed: 0 (exact), {MIN_BUDGET}..{MAX_BUDGET}, "
                          f"{FLOAT16_WIDTH} (float16)")
    return array.astype(np.int64)


def unit_cells(n_layers: int, n_kv_heads: int, granularity: str) -> list[dict[str, Any]]:
    """The units of a map, in (layer, side, head) order: each ``{"layer", "side", "kv_head",
    "cells"}`` with ``side`` ``"K"``, ``"V"`` or :data:`BOTH_SIDES`, ``kv_head`` a head or
    :data:`ALL_HEADS`, and ``cells`` a boolean mask of the map's shape."""
    if granularity not in GRANULARITIES:
        raise KvasymError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    units = []
    for layer in range(n_layers):
        sides = [(BOTH_SIDES, (0, 1))] if granularity == "layer" else [(s, (i,)) for i, s in enumerate(SIDES)]
        for side, side_index in sides:
            heads = [ALL_HEADS] if granularity != "layer_side_head" else list(range(n_kv_heads))
            for head in heads:
                cells = np.zeros((n_layers, 2, n_kv_heads), dtype=bool)
                cells[layer, list(side_index), slice(None) if head == ALL_HEADS else head] = True
                units.append({"layer": layer, "side": side, "kv_head": head, "cells": cells})
    return units


def _float16(rows: np.ndarray) -> np.ndarray:
    return rows.astype(np.float16).astype(rows.dtype)


def mixed_cache(keys: np.ndarray, values: np.ndarray, widths: np.ndarray, scheme: Scheme, *, base_seed: int,
                seed_text: str, layer: int, norm_dtype: str = "float32",
                bits: list[dict[str, float]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(K_hat, V_hat)`` of one layer's cache (n_kv_heads, T, head_dim) under its widths (2, n_kv_heads).

    A head with two quantized widths is quantized once per distinct width (the same identity,
    so each side's rows are the ones a uniform pass at that width stores). Each quantized or
    float16 cell's bits per value are appended to ``bits`` as ``{"side", "payload", "side_bits"}``.
    """
    k_hat = np.array(keys, copy=True)
    v_hat = np.array(values, copy=True)
    outputs = (k_hat, v_hat)
    for head in range(keys.shape[0]):
        for width in sorted({int(w) for w in widths[:, head]} - {0}):
            sides = [i for i in range(2) if int(widths[i, head]) == width]
            if width == FLOAT16_WIDTH:
                for i in sides:
                    outputs[i][head] = _float16((keys, values)[i][head])
                    if bits is not None:
                        bits.append({"side": SIDES[i], "payload": float(FLOAT16_WIDTH), "side_bits": 0.0})
                continue
            packed = quantize_pair(np.asarray(keys[head], dtype=np.float64), np.asarray(values[head], dtype=np.float64),
                                   scheme, width, base_seed=base_seed, identity=(seed_text, int(layer), head),
                                   norm_dtype=norm_dtype, kernel="auto")
            for i in sides:
                outputs[i][head] = dequantize_with(packed[SIDES[i]], "auto")
                if bits is not None:
                    measured = packed[SIDES[i]].bits_per_coordinate()
                    bits.append({"side": SIDES[i], "payload": float(measured["payload"]),
                                 "side_bits": float(measured["side"])})
    return k_hat, v_hat


def mixed_layers(model: GGUFLlama, frame: SequenceFrame, x: np.ndarray, start: int, widths: np.ndarray,
                 scheme: Scheme, *, base_seed: int, seed_text: str, norm_dtype: str = "float32",
                 bits: list[dict[str, float]] | None = None) -> np.ndarray:
    """Final hidden states (T, d_model) of the pass entering layer ``start`` with residual ``x``,
    each layer reading its cache through ``widths[layer]`` (a layer with every width 0 runs the
    model's own attention, operation for operation)."""
    for index in range(start, len(model.layers)):
        acts = model.attention_inputs(index, x, frame)
        if not np.any(widths[index]):
            attended = model.attention(acts.q, acts.k, acts.v, frame.at(index))
        else:
            k_hat, v_hat = mixed_cache(acts.k, acts.v, widths[index], scheme, base_seed=base_seed,
                                       seed_text=seed_text, layer=index, norm_dtype=norm_dtype, bits=bits)
            attended = model.attention(acts.q, k_hat, v_hat, frame.at(index), own=(acts.k, acts.v))
        x = model.finish_layer(index, x, attended)
    return model.final_hidden(x)


def mean_bits(bits: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """:data:`BITS_COLUMNS` of a pass: per side, the mean over its counted cells (0 when none)."""
    out = {}
    for side in SIDES:
        cells = [b for b in bits if b["side"] == side]
        out[f"{side.lower()}_bits_payload"] = float(np.mean([b["payload"] for b in cells])) if cells else 0.0
        out[f"{side.lower()}_bits_side"] = float(np.mean([b["side_bits"] for b in cells])) if cells else 0.0
    return out


def map_bits(widths: np.ndarray, unit_bits: Mapping[int, float]) -> float:
    """Mean total bits per value of a map, every cell at ``unit_bits[width]`` (measured)."""
    return float(np.mean([unit_bits[int(w)] for w in np.asarray(widths).ravel()]))


def mixed_pass_rows(model: GGUFLlama, ref: Reference, widths: np.ndarray, scheme: Scheme, *, text: str, draw: int,
                    label: str, budget: int, base_seed: int, norm_dtype: str = "float32") -> dict[str, np.ndarray]:
    """The per-position rows of one all-layer pass with map ``widths``, in the end-to-end
    passes' columns (:func:`kvasym.real.endtoend.evaluate_text`; the bits as its
    ``BITS_COLUMNS``): scheme column ``label``, ``budget`` the uniform budget the map is compared
    with, ``layer`` :data:`ALL_LAYERS`. Draw ``s > 0`` seeds with ``"<text>/draw<s>"``
    (:func:`kvasym.real.endtoend.draw_seed_text`)."""
    c = model.config
    widths = check_widths(widths, (len(model.layers), 2, c.n_kv_heads))
    seed_text = draw_seed_text(text, draw)
    bits: list[dict[str, float]] = []
    hidden = mixed_layers(model, ref.frame, ref.residuals[0], 0, widths, scheme, base_seed=base_seed,
                          seed_text=seed_text, norm_dtype=norm_dtype, bits=bits)
    measured = next_token_metrics(model, ref, hidden)
    n = ref.nll.size
    fixed: dict[str, Any] = {"text": text, "draw": int(draw), "scheme": label, "budget": int(budget),
                             "rope": "post", "own": "exact", "layer": ALL_LAYERS, **mean_bits(bits)}
    out: dict[str, np.ndarray] = {key: np.full(n, value, dtype=object if isinstance(value, str) else None)
                                  for key, value in fixed.items()}
    out["position"] = np.arange(n, dtype=np.int32)
    out["nll_ref"] = ref.nll
    out.update(measured)
    for key in ("layer", "budget", "draw"):
        out[key] = out[key].astype(np.int32)
    out["top1"] = out["top1"].astype(np.int8)
    return out


def sensitivity(model: GGUFLlama, ref: Reference, scheme: Scheme, widths: Sequence[int], granularity: str, *,
                text: str, base_seed: int, norm_dtype: str = "float32",
                part: Sequence[int] = (0, 1), workers: int = 1) -> dict[str, np.ndarray]:
    """Each unit's sensitivity curve on one text (module docstring): one row per (unit, width)
    with :data:`SENSITIVITY_COLUMNS` — ``bits`` the unit's measured total bits per value,
    ``kl`` the mean next-token KL, ``dnll`` the mean change of the next token's NLL (nats;
    ``exp(dnll)`` is roughly the perplexity ratio), ``top1`` the share of positions whose argmax
    is kept. Cost: one pass from the unit's layer per (unit, width), ``O(U x W)`` partial passes.

    ``part = (p, P)`` runs (unit, width) rows ``p, p + P, ...`` of the (layer, side, kv_head,
    width) order only (:func:`kvasym.real.jobparts.select_round_robin`): a row depends on its
    unit, width and the reference only, so the parts' rows joined by those columns
    (:func:`kvasym.real.jobparts.join_by_units`) are the whole table row for row. The rows run on
    ``workers`` processes forked after the reference pass (:func:`kvasym.workers.map_ordered`),
    with the same table whatever their number.
    """
    from ..workers import map_ordered

    c = model.config
    chosen = [int(w) for w in widths]
    if not chosen or len(set(chosen)) != len(chosen) or not set(chosen) <= set(WIDTHS):
        raise KvasymError(f"sensitivity widths must be distinct values of {list(WIDTHS)}, got {list(widths)}")
    shape = (len(model.layers), 2, c.n_kv_heads)
    grid = [(unit, width) for unit in unit_cells(*shape[::2], granularity) for width in chosen]

    def row(cell: tuple[dict[str, Any], int]) -> tuple[tuple[str, Any], ...]:
        unit, width = cell
        layer = unit["layer"]
        widths_map = np.where(unit["cells"], width, 0).astype(np.int64)
        bits: list[dict[str, float]] = []
        hidden = mixed_layers(model, ref.frame, ref.residuals[layer], layer, widths_map, scheme,
                              base_seed=base_seed, seed_text=text, norm_dtype=norm_dtype, bits=bits)
        measured = next_token_metrics(model, ref, hidden)
        total = [b["payload"] + b["side_bits"] for b in bits]
        return (("text", text), ("layer", layer), ("side", unit["side"]), ("kv_head", unit["kv_head"]),
                ("width", width), ("bits", float(np.mean(total))), ("kl", float(np.mean(measured["kl"]))),
                ("dnll", float(np.mean(measured["nll"] - ref.nll))), ("top1", float(np.mean(measured["top1"]))),
                ("n_positions", int(ref.nll.size)))

    rows: dict[str, list[Any]] = {key: [] for key in SENSITIVITY_COLUMNS}
    cells = select_round_robin(grid, part, "sensitivity rows (units x widths)")
    for measured_row in map_ordered(row, cells, workers):
        for key, value in measured_row:
            rows[key].append(value)
    return {key: np.asarray(value, dtype=object if key in ("text", "side") else None) for key, value in rows.items()}


#: Columns of an allocation table (:func:`measured_allocation`), one row per (budget, unit).
ALLOCATION_COLUMNS = ("budget", "target_bits", "mean_bits", "predicted_kl", "uniform_predicted_kl", "k_mean_width",
                      "v_mean_width", "layer", "side", "kv_head", "width")


def measured_allocation(table: Any, n_layers: int, n_kv_heads: int, granularity: str,
                        budgets: Sequence[int], *, tie_sides: bool = False) -> Any:
    """The widths that minimise the predicted KL at each uniform budget's measured rate.

    ``table`` holds :data:`SENSITIVITY_COLUMNS` rows of calibration texts at ``granularity``
    (every unit measured at every width of the table, in every text). Per unit and width the
    distortion is the mean over texts of ``kl`` and the cost the mean of ``bits``; for budget
    ``n`` (a width of the table) the target is the uniform map's measured rate (the mean over
    units of their cost at ``n``) and :func:`kvasym.allocation.solve_allocation` picks the map
    of least predicted KL (the sum over units) at no more bits. Returns a DataFrame with
    :data:`ALLOCATION_COLUMNS`: one row per (budget, unit), ``predicted_kl`` and
    ``uniform_predicted_kl`` the sums over units for the chosen and the uniform map.

    ``tie_sides=True`` (granularity ``layer_side`` or ``layer_side_head``): the K and V units of a
    layer (and head) take one width, chosen from the same sensitivities: the tied unit's
    predicted KL is the sum of its sides', its cost their mean (so the uniform map's rate, the
    target, is the same). It is the allocation with one width per layer that the free one
    (K and V apart) is compared with, at the same rate and under the same additive model.
    """
    import pandas as pd

    from ..allocation import solve_allocation

    frame = pd.DataFrame(table)
    missing = sorted(set(SENSITIVITY_COLUMNS) - set(frame.columns))
    if missing:
        raise KvasymError(f"sensitivity table lacks columns {missing}")
    units = unit_cells(n_layers, n_kv_heads, granularity)
    keys = [(u["layer"], u["side"], u["kv_head"]) for u in units]
    widths = sorted(int(w) for w in frame["width"].unique())
    texts = sorted(frame["text"].unique())
    means = frame.groupby(["layer", "side", "kv_head", "width"])[["kl", "bits"]].mean()
    counts = frame.groupby(["layer", "side", "kv_head", "width"])["text"].nunique()
    cost = np.empty((len(units), len(widths)))
    distortion = np.empty_like(cost)
    for i, key in enumerate(keys):
        for j, width in enumerate(widths):
            index = (*key, width)
            if index not in counts.index or counts[index] != len(texts):
                raise KvasymError(f"sensitivity table: unit (layer, side, kv_head) = {key} at width {width} is not "
                                  f"measured in every text {texts} (granularity {granularity!r})")
            cost[i, j], distortion[i, j] = means.loc[index, "bits"], means.loc[index, "kl"]
    # the units solved for: each unit, or with tie_sides each (layer, kv_head)'s K and V units as one
    groups = [[i] for i in range(len(keys))]
    if tie_sides:
        if granularity == "layer":
            raise KvasymError("tie_sides needs granularity layer_side or layer_side_head (a layer unit holds both "
                              "sides already)")
        by_cell: dict[tuple[int, int], list[int]] = {}
        for i, (layer, _, head) in enumerate(keys):
            by_cell.setdefault((layer, head), []).append(i)
        groups = list(by_cell.values())
    group_cost = np.array([cost[g].mean(axis=0) for g in groups])
    group_distortion = np.array([distortion[g].sum(axis=0) for g in groups])
    rows = []
    for budget in budgets:
        if int(budget) not in widths:
            raise KvasymError(f"budget {budget} is not a measured width {widths}: the uniform map is the reference")
        j = widths.index(int(budget))
        target = float(cost[:, j].mean())
        group_choices, predicted, mean_cost = solve_allocation(group_cost, group_distortion, target)
        choices = np.empty(len(keys), dtype=np.int64)
        for g, choice in zip(groups, group_choices):
            choices[g] = int(choice)
        uniform = float(distortion[:, j].sum())
        chosen = np.asarray([widths[int(c)] for c in choices], dtype=float)
        sides = np.asarray([side for _, side, _ in keys])
        # mean width of each side's values (NaN at granularity "layer", whose units hold both)
        side_means = {s: float(chosen[sides == s].mean()) if np.any(sides == s) else float("nan") for s in SIDES}
        for (layer, side, head), width in zip(keys, chosen):
            rows.append({"budget": int(budget), "target_bits": target, "mean_bits": mean_cost,
                         "predicted_kl": predicted, "uniform_predicted_kl": uniform,
                         "k_mean_width": side_means["K"], "v_mean_width": side_means["V"], "layer": int(layer),
                         "side": side, "kv_head": int(head), "width": int(width)})
    return pd.DataFrame(rows, columns=list(ALLOCATION_COLUMNS))


def allocation_map(allocation: Any, budget: int, n_layers: int, n_kv_heads: int) -> np.ndarray:
    """The width map (n_layers, 2, n_kv_heads) of budget ``budget``'s rows of an allocation table."""
    rows = allocation[allocation["budget"] == int(budget)]
    if rows.empty:
        raise KvasymError(f"the allocation table has no rows for budget {budget}")
    widths = np.zeros((n_layers, 2, n_kv_heads), dtype=np.int64)
    for row in rows.itertuples():
        sides = [0, 1] if row.side == BOTH_SIDES else [SIDES.index(row.side)]
        heads = slice(None) if row.kv_head == ALL_HEADS else int(row.kv_head)
        for s in sides:
            widths[int(row.layer), s, heads] = int(row.width)
    if np.any(widths == 0):
        raise KvasymError(f"the allocation of budget {budget} leaves cells of the map unassigned")
    return widths
