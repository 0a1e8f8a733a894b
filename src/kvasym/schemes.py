"""Quantization schemes as declarative data.

A scheme says, for each cache side (K and V), whether the side is rotated (randomized WHT),
how many scalar (Lloyd-Max) bits each coordinate gets, and whether a 1-bit sketch of the
residual is added, and which: ``sketch: gaussian`` (QJL's i.i.d. Gaussian matrix, the default)
or ``sketch: hadamard`` (an orthogonal randomized-Hadamard sketch, :mod:`kvasym.sketch`).
Every scheme spends the same budget of ``n`` bits per coordinate: on each side
``scalar_bits + (1 if qjl) == n``, which is checked, so no scheme can win by spending more.

``scalar_bits`` is written relative to the budget: ``"n"`` or ``"n-1"`` (``"n-k"`` in general).
A spec that breaks the budget, or needs a negative scalar width or more than 8 scalar bits at a
budget, is rejected with an error naming the scheme, the side and the budget. ``n - 1 = 0``
scalar bits with QJL (pure QJL at n = 1) is allowed.

Built in: the paper's KV, KQV, QKQV and ``RKV`` (rotated scalar on both sides, no QJL: the
TurboQuant_mse construction deployed systems use). Users add schemes in config, in the same
mapping form as :data:`BUILTIN_SCHEMES`.

References
----------
.. [1] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for KV
   Cache Quantization with Zero Overhead", arXiv:2406.03482 (the 1-bit residual sketch).
.. [2] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874 (rotation + scalar
   codebook, and its (n-1)-bit + QJL inner-product variant).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import KvasymError

__all__ = [
    "MIN_BUDGET",
    "MAX_BUDGET",
    "MAX_SCALAR_BITS",
    "SIDES",
    "SideSpec",
    "Scheme",
    "scheme_from_dict",
    "BUILTIN_SCHEMES",
    "scheme_registry",
    "get_scheme",
]

MIN_BUDGET = 1
MAX_BUDGET = 8
MAX_SCALAR_BITS = 8
SIDES = ("K", "V")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]{0,39}$")
_RELATIVE = re.compile(r"^n(?:\s*-\s*(\d+))?$")


@dataclass(frozen=True)
class SideSpec:
    """How one cache side is quantized: ``scalar_offset`` bits below the budget, + QJL or not.

    Parameters
    ----------
    rotate : bool
        Apply the randomized Walsh-Hadamard rotation before the scalar quantizer.
    scalar_offset : int
        ``k`` in ``scalar_bits = n - k``.
    qjl : bool
        Add a 1-bit sketch of the scalar quantizer's residual.
    sketch : {"gaussian", "hadamard"}, optional
        Which sketch when ``qjl`` (default ``"gaussian"``, QJL's; :data:`~kvasym.sketch.SKETCH_KINDS`).
    """

    rotate: bool
    scalar_offset: int
    qjl: bool
    sketch: str = "gaussian"

    def __post_init__(self) -> None:
        from .sketch import SKETCH_KINDS

        if self.sketch not in SKETCH_KINDS:
            raise KvasymError(f"sketch must be one of {', '.join(SKETCH_KINDS)}, got {self.sketch!r}")
        if self.sketch != "gaussian" and not self.qjl:
            raise KvasymError(f"sketch {self.sketch!r} needs qjl: true (a side without a sketch has no sketch kind)")

    def scalar_bits(self, budget: int) -> int:
        """Scalar bits per coordinate at ``budget``: ``budget - scalar_offset`` (may be < 0).

        Parameters
        ----------
        budget : int
            Bits per coordinate ``n``.

        Returns
        -------
        int
        """
        return budget - self.scalar_offset

    @property
    def scalar_bits_expr(self) -> str:
        """The scalar width as written in config: ``"n"`` or ``"n-k"``."""
        return "n" if self.scalar_offset == 0 else f"n-{self.scalar_offset}"

    def to_dict(self) -> dict:
        """The config mapping ``{rotate, scalar_bits, qjl[, sketch]}`` of this side (inverse of
        parsing; ``sketch`` only when it is not the default ``gaussian``)."""
        out: dict = {"rotate": self.rotate, "scalar_bits": self.scalar_bits_expr, "qjl": self.qjl}
        if self.sketch != "gaussian":
            out["sketch"] = self.sketch
        return out


@dataclass(frozen=True)
class Scheme:
    """A named quantization scheme: one :class:`SideSpec` per cache side.

    Parameters
    ----------
    name : str
        Scheme name (a letter, then up to 39 letters, digits, ``_ . + -``).
    K : SideSpec
        How keys are quantized.
    V : SideSpec
        How values are quantized.
    description : str, optional
        Free text for tables and the paper.
    """

    name: str
    K: SideSpec
    V: SideSpec
    description: str = ""

    def side(self, side: str) -> SideSpec:
        """The spec of cache side ``"K"`` or ``"V"``.

        Parameters
        ----------
        side : str
            ``"K"`` or ``"V"``.

        Returns
        -------
        SideSpec

        Raises
        ------
        KvasymError
            If ``side`` is not one of :data:`SIDES`.
        """
        if side not in SIDES:
            raise KvasymError(f"cache side must be one of {', '.join(SIDES)}, got {side!r}")
        return self.K if side == "K" else self.V

    def validate_budget(self, budget: int) -> None:
        """Raise KvasymError unless this scheme is realisable at ``budget`` bits per coordinate.

        Parameters
        ----------
        budget : int
            Bits per coordinate ``n``.

        Raises
        ------
        KvasymError
            If ``budget`` is not an integer in ``MIN_BUDGET..MAX_BUDGET``, or on some side the
            scalar width is negative or above :data:`MAX_SCALAR_BITS`, or
            ``scalar_bits + (1 if qjl) != budget``, or the side stores nothing (0 scalar bits,
            no QJL). The message names the scheme, the side and the budget.
        """
        if isinstance(budget, bool) or not isinstance(budget, int) or not MIN_BUDGET <= budget <= MAX_BUDGET:
            raise KvasymError(f"budget must be an integer in {MIN_BUDGET}..{MAX_BUDGET}, got {budget!r}")
        for side in SIDES:
            spec = self.side(side)
            scalar = spec.scalar_bits(budget)
            where = f"scheme {self.name} side {side} at budget n={budget}"
            if scalar < 0:
                raise KvasymError(f"{where}: scalar_bits {spec.scalar_bits_expr} = {scalar} < 0 is impossible")
            if scalar > MAX_SCALAR_BITS:
                raise KvasymError(f"{where}: scalar_bits = {scalar} exceeds {MAX_SCALAR_BITS}")
            spent = scalar + (1 if spec.qjl else 0)
            if spent != budget:
                raise KvasymError(
                    f"{where}: spends {spent} bits per coordinate "
                    f"({spec.scalar_bits_expr} scalar{' + 1 QJL' if spec.qjl else ''}), "
                    f"not the budget {budget}; every scheme must spend exactly n"
                )
            if scalar == 0 and not spec.qjl:
                raise KvasymError(f"{where}: no scalar bits and no QJL stores nothing")

    def to_dict(self) -> dict:
        """The config mapping ``{K: {...}, V: {...}[, description]}`` of this scheme."""
        out = {"K": self.K.to_dict(), "V": self.V.to_dict()}
        if self.description:
            out["description"] = self.description
        return out


def _parse_side(data: object, where: str) -> SideSpec:
    if not isinstance(data, Mapping):
        raise KvasymError(f"{where} must be a mapping with rotate, scalar_bits, qjl; got {data!r}")
    unknown = set(data) - {"rotate", "scalar_bits", "qjl", "sketch"}
    if unknown:
        raise KvasymError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: rotate, scalar_bits, qjl, sketch")
    for key in ("rotate", "scalar_bits", "qjl"):
        if key not in data:
            raise KvasymError(f"{where}.{key} is missing")
    for key in ("rotate", "qjl"):
        if not isinstance(data[key], bool):
            raise KvasymError(f"{where}.{key} must be true or false, got {data[key]!r}")
    expr = data["scalar_bits"]
    match = _RELATIVE.match(expr.strip()) if isinstance(expr, str) else None
    if match is None:
        raise KvasymError(f"{where}.scalar_bits must be 'n' or 'n-k' (k a whole number), got {expr!r}")
    offset = int(match.group(1) or 0)
    sketch = data.get("sketch", "gaussian")
    from .sketch import SKETCH_KINDS

    if sketch not in SKETCH_KINDS:
        raise KvasymError(f"{where}.sketch must be one of {', '.join(SKETCH_KINDS)}, got {sketch!r}")
    if "sketch" in data and not data["qjl"]:
        raise KvasymError(f"{where}.sketch is set but qjl is false: a side without a sketch has no sketch kind")
    return SideSpec(rotate=data["rotate"], scalar_offset=offset, qjl=data["qjl"], sketch=sketch)


def scheme_from_dict(name: str, data: object) -> Scheme:
    """Parse one scheme from its config mapping ``{K: {...}, V: {...}, description: ...}``.

    Parameters
    ----------
    name : str
        Scheme name: a letter, then up to 39 letters, digits, ``_``, ``.``, ``+`` or ``-``.
    data : mapping
        ``K`` and ``V`` (each ``{rotate: bool, scalar_bits: "n" | "n-k", qjl: bool}``, plus
        ``sketch: gaussian | hadamard`` when ``qjl``) and an
        optional ``description`` string; no other key.

    Returns
    -------
    Scheme
        The parsed scheme (the budget is not checked here: see :meth:`Scheme.validate_budget`).

    Raises
    ------
    KvasymError
        If the name is invalid, or a key is missing, unknown or of the wrong type; the message
        gives the config path (``schemes.<name>.<side>.<key>``).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise KvasymError(
            f"scheme name {name!r} must start with a letter and use only letters, digits, '_', '.', '+', '-' (max 40)"
        )
    where = f"schemes.{name}"
    if not isinstance(data, Mapping):
        raise KvasymError(f"{where} must be a mapping with K and V, got {data!r}")
    unknown = set(data) - {"K", "V", "description"}
    if unknown:
        raise KvasymError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: K, V, description")
    for side in SIDES:
        if side not in data:
            raise KvasymError(f"{where}.{side} is missing")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise KvasymError(f"{where}.description must be a string")
    return Scheme(name, _parse_side(data["K"], f"{where}.K"), _parse_side(data["V"], f"{where}.V"), description)


BUILTIN_SCHEMES: dict[str, dict] = {
    "KV": {
        "description": "scalar Lloyd-Max on raw coordinates, n bits, both sides (no rotation, no sketch)",
        "K": {"rotate": False, "scalar_bits": "n", "qjl": False},
        "V": {"rotate": False, "scalar_bits": "n", "qjl": False},
    },
    "KQV": {
        "description": "WHT; K n-bit scalar; V (n-1)-bit scalar + 1-bit QJL residual",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False},
        "V": {"rotate": True, "scalar_bits": "n-1", "qjl": True},
    },
    "QKQV": {
        "description": "WHT; K and V (n-1)-bit scalar + 1-bit QJL residual",
        "K": {"rotate": True, "scalar_bits": "n-1", "qjl": True},
        "V": {"rotate": True, "scalar_bits": "n-1", "qjl": True},
    },
    "RKV": {
        "description": "WHT; n-bit scalar on both sides, no QJL (TurboQuant_mse as deployed)",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False},
        "V": {"rotate": True, "scalar_bits": "n", "qjl": False},
    },
}


def scheme_registry(user_schemes: Mapping | None = None) -> dict[str, Scheme]:
    """Built-in schemes plus the user's (a user scheme may not silently redefine a built-in).

    Parameters
    ----------
    user_schemes : mapping, optional
        ``{name: mapping}`` in the form of :data:`BUILTIN_SCHEMES`.

    Returns
    -------
    dict of str to Scheme
        The built-in schemes, then the user's.

    Raises
    ------
    KvasymError
        If a user scheme is invalid, or reuses a built-in name with a different definition
        (an identical copy is accepted).
    """
    registry = {name: scheme_from_dict(name, spec) for name, spec in BUILTIN_SCHEMES.items()}
    for name, spec in (user_schemes or {}).items():
        if name in registry and spec != BUILTIN_SCHEMES.get(name):
            raise KvasymError(f"schemes.{name} redefines the built-in scheme {name}; choose another name")
        registry[name] = scheme_from_dict(name, spec)
    return registry


def get_scheme(name: str, user_schemes: Mapping | None = None) -> Scheme:
    """The scheme called ``name`` among the built-in and user schemes.

    Parameters
    ----------
    name : str
        Scheme name, e.g. ``"KQV"``.
    user_schemes : mapping, optional
        User schemes (see :func:`scheme_registry`).

    Returns
    -------
    Scheme

    Raises
    ------
    KvasymError
        If no scheme has that name (the message lists the known ones), or a user scheme is
        invalid.
    """
    registry = scheme_registry(user_schemes)
    if name not in registry:
        raise KvasymError(f"unknown scheme {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]
