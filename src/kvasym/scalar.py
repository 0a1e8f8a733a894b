"""Exact, fast scalar encoding of values against sorted thresholds.

``encode(x)`` returns, for each value, the number of thresholds ``t_j <= x`` (a value equal to a
threshold goes to the upper cell), exactly as ``np.searchsorted(t, x, side="right")`` with the
thresholds cast to ``x``'s dtype, but without a binary search per value (which costs ~5x more in
numpy). A uniform grid over the thresholds' range, with cells narrower than the smallest gap
between thresholds, holds at most one threshold per cell; per cell, a table gives the count of
thresholds below the cell and the threshold inside it (or +inf). Then

    code(x) = below[g] + (x >= inside[g]),   g = floor((x - lo) / width)

is exact for every x in cell g. The grid is shifted so that every threshold lies at least
``1 / (2 * (n_thresholds + 1))`` of a cell away from any cell edge (the middle of the widest gap
between the thresholds' fractional cell positions); float rounding moves ``g`` only for values
within ~1e-4 of a cell of an edge, where no threshold lies, so a value assigned to the
neighbouring cell still gets the same code.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CELLS_PER_GAP", "MAX_CELLS", "ThresholdEncoder"]

#: Grid cells per smallest threshold gap (>= 2 keeps one threshold per cell).
CELLS_PER_GAP = 2


#: Largest lookup grid built; beyond it (pathological threshold spacings) the encoder falls
#: back to np.searchsorted, which is exact and only slower.
MAX_CELLS = 1 << 20


class ThresholdEncoder:
    """Encoder for one strictly increasing threshold vector (1..255 thresholds: uint8 codes).

    Tables are built per input dtype from the thresholds rounded to that dtype, because the
    comparison happens in that dtype: a float32 threshold can round across a grid edge.

    Parameters
    ----------
    thresholds : array_like
        1..255 finite, strictly increasing values ``t_0 < ... < t_{K-1}`` (e.g.
        :attr:`kvasym.codebook.Codebook.thresholds`).

    Raises
    ------
    ValueError
        If ``thresholds`` is not 1-D, is empty, has more than 255 values, a non-finite value, or
        is not strictly increasing.

    See Also
    --------
    numpy.searchsorted : the reference, ``searchsorted(t, x, side="right")``.

    Notes
    -----
    ``code(x) = #{j : t_j <= x}``, computed as
    ``below[g] + (x >= inside[g])`` with ``g = floor((x - lo) / width)`` on a grid whose cells
    hold at most one threshold each (see the module docstring).
    """

    def __init__(self, thresholds: np.ndarray) -> None:
        t = np.asarray(thresholds, dtype=np.float64)
        if t.ndim != 1 or t.size == 0 or t.size > 255 or not np.all(np.isfinite(t)) or not np.all(np.diff(t) > 0):
            raise ValueError("thresholds must be 1..255 strictly increasing values")
        self.thresholds = t
        self._tables: dict[np.dtype, tuple | None] = {}

    def _table(self, dtype: np.dtype) -> tuple | None:
        if dtype not in self._tables:
            self._tables[dtype] = _build_table(self.thresholds.astype(dtype).astype(np.float64))
        return self._tables[dtype]

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Codes in 0..len(thresholds) as uint8, same shape as ``x`` (finite values expected).

        Parameters
        ----------
        x : array_like
            Values to encode; float32 and float64 are compared in their own dtype, anything
            else is cast to float64 first.

        Returns
        -------
        numpy.ndarray
            ``uint8`` codes ``#{j : t_j <= x}`` (a value equal to a threshold goes to the upper
            cell), identical to ``np.searchsorted(t.astype(x.dtype), x, side="right")``.
        """
        x = np.asarray(x)
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float64)
        scalar = x.dtype.type
        if self.thresholds.size == 1:
            return (x >= scalar(self.thresholds[0])).view(np.uint8)
        table = self._table(x.dtype)
        if table is None:
            return np.searchsorted(self.thresholds.astype(x.dtype), x, side="right").astype(np.uint8)
        lo, inv_width, below, inside = table
        with np.errstate(over="ignore", invalid="ignore"):
            grid = x - scalar(lo)
            grid *= scalar(inv_width)
        np.clip(grid, 0, below.size - 1, out=grid)
        cell = grid.astype(np.int32)
        code = below[cell]
        code += x >= inside.astype(x.dtype)[cell]
        return code


def _build_table(t: np.ndarray) -> tuple | None:
    """(lo, 1/width, below, inside) for thresholds t (float64 values exact in the input dtype),
    or None when they are not strictly increasing or the grid would exceed MAX_CELLS."""
    if not np.all(np.diff(t) > 0):
        return None
    gap = float(np.min(np.diff(t)))
    width = gap / CELLS_PER_GAP
    # Shift the grid so that thresholds sit far from cell edges (see the module docstring).
    frac = np.sort(np.mod((t - t[0]) / width, 1.0))
    gaps = np.diff(np.concatenate((frac, [frac[0] + 1.0])))
    widest = int(np.argmax(gaps))
    edge_offset = frac[widest] + 0.5 * gaps[widest]  # in cells, relative to t[0]
    lo = float(t[0]) + (edge_offset - np.ceil(edge_offset) - 1.0) * width
    cells = int(np.ceil((t[-1] - lo) / width)) + 2
    if cells > MAX_CELLS:
        return None
    edges = lo + width * np.arange(cells + 1)
    below = np.searchsorted(t, edges[:-1], side="right").astype(np.uint8)
    inside = np.full(cells, np.inf)
    cell_of = np.floor((t - lo) / width).astype(np.intp)
    if np.any(np.diff(cell_of) == 0):
        return None  # rounding put two thresholds in one cell: stay exact, use searchsorted
    inside[cell_of] = t
    return lo, 1.0 / width, below, inside
