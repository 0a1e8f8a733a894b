"""Quantization schemes as declarative data.

A scheme says, for each cache side (K and V), whether the side is rotated (randomized WHT),
how many scalar (Lloyd-Max) bits each coordinate gets, and whether a 1-bit sketch of the
residual is added, and which: ``sketch: gaussian`` (QJL's i.i.d. Gaussian matrix, the default)
or ``sketch: hadamard`` (an orthogonal randomized-Hadamard sketch, :mod:`kvasym.sketch`).
Every scheme spends the same budget of ``n`` bits per coordinate: on each side
``scalar_bits + (sketch_m if qjl) == n`` (``sketch_m`` 1, or 2 for ``sketch_m: 2d``), which is
checked, so no scheme can win by spending more. Beyond these keys a side composes primitives
(``center``, ``transform``, ``allocation``, ``scalar``, ``rescale``; :class:`SideSpec`,
:mod:`kvasym.composed`), whose side information is measured, never hidden in the budget.

``scalar_bits`` is written relative to the budget: ``"n"`` or ``"n-1"`` (``"n-k"`` in general).
A spec that breaks the budget, or needs a negative scalar width or more than 8 scalar bits at a
budget, is rejected with an error naming the scheme, the side and the budget. ``n - 1 = 0``
scalar bits with QJL (pure QJL at n = 1) is allowed.

Built in: the paper's KV, KQV, QKQV and ``RKV`` (rotated scalar on both sides, no QJL: the
TurboQuant_mse construction deployed systems use), and, made of primitives and outside the
paper's grid, ``KQV-H``, ``QKQV-H``, ``CRKV``, ``SKLT``, ``KIVI32``, ``KIVI128``, ``RKV-EDEN``, and
the ablations of issue 14 (point 9) ``HRKV``, ``HKQV`` (a Haar rotation in place of the
WHT) and ``KQV-NS`` (KQV's values without their sketch: they spend ``n - 1`` bits).
Users add schemes in config, in the same mapping form as :data:`BUILTIN_SCHEMES`.

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
    "PRIMITIVE_KEYS",
    "SideSpec",
    "spec_of",
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


#: Side keys beyond the original four, each naming one composable primitive (see :class:`SideSpec`).
PRIMITIVE_KEYS = ("center", "transform", "transform_dtype", "allocation", "scalar", "axis", "group",
                  "normalize", "sketch_m", "rescale")
#: The one side key that lets a side spend fewer bits than the budget (an ablation), never more.
SPEND_KEY = "spend"
TRANSFORMS = ("none", "wht", "klt", "haar")
#: Transforms drawn from the side's rotation seed (stored in the packed cache, counted as side bits).
SEEDED_TRANSFORMS = ("wht", "haar")
ALLOCATIONS = ("uniform", "waterfill")
SCALARS = ("lloyd_max", "minmax", "q_0", "q8_0")
#: The scalars that code groups of entries against stored per-group scales (no row norms):
#: KIVI's minmax and llama.cpp's block types (:mod:`kvasym.blockq`).
GROUPED_SCALARS = ("minmax", "q_0", "q8_0")
SKETCH_M = ("d", "2d")
#: Per-token normalization before a minmax quantizer: none, or KVarN-style dual scaling (:mod:`kvasym.dualscale`).
NORMALIZE = ("none", "dual")
_DEFAULTS = {"center": False, "transform_dtype": "float32", "allocation": "uniform", "scalar": "lloyd_max",
             "axis": "channel", "group": 32, "normalize": "none", "sketch_m": 1, "rescale": "none"}


@dataclass(frozen=True)
class SideSpec:
    """How one cache side is quantized: a pipeline of primitives, ``scalar_offset`` bits below
    the budget for the scalar quantizer, + a 1-bit-per-row-coordinate sketch or not.

    The side's pipeline, in order (each stage optional; the defaults are the original schemes):
    ``center`` (subtract the block's stored mean), ``transform`` (``none``, ``wht`` = the
    randomized Walsh-Hadamard rotation, or ``klt`` = the block's own principal basis), the
    ``scalar`` quantizer (``lloyd_max``: per-row norm, then Beta codebooks with ``uniform``
    allocation or Gaussian codebooks scaled per coordinate with ``waterfill``; ``minmax``:
    KIVI's group-wise asymmetric uniform quantizer; or ``q_0``/``q8_0``: llama.cpp's block
    types q4_0/q5_0 and q8_0, :mod:`kvasym.blockq`), ``rescale`` (EDEN / least squares scale of
    the lloyd_max reconstruction) and the residual ``sketch`` (``m = d`` or ``2d`` sign bits).

    Parameters
    ----------
    rotate : bool
        Apply the randomized Walsh-Hadamard rotation before the scalar quantizer (``transform:
        wht``).
    scalar_offset : int
        ``k`` in ``scalar_bits = n - k``.
    qjl : bool
        Add a sketch of the scalar quantizer's residual.
    sketch : {"gaussian", "hadamard"}, optional
        Which sketch when ``qjl`` (default ``"gaussian"``, QJL's; :data:`~kvasym.sketch.SKETCH_KINDS`).
    center : bool, optional
        Subtract the block's mean vector first (:mod:`kvasym.centering`; default False).
    transform : {"none", "wht", "klt", "haar"} or None, optional
        The orthogonal transform; None (default) means ``"wht" if rotate else "none"``. ``rotate``
        must agree with it (``rotate`` is True exactly for ``"wht"``). ``"haar"`` is a dense
        Haar-random orthogonal matrix from the rotation seed (:class:`kvasym.rotation.HaarRotation`).
    transform_dtype : {"float16", "float32"}, optional
        Storage precision of the KLT basis (:mod:`kvasym.klt`; default ``"float32"``).
    allocation : {"uniform", "waterfill"}, optional
        Bits per transform coordinate: the same for all, or reverse water-filling over the
        coordinate variances (:mod:`kvasym.waterfill`; lloyd_max only).
    scalar : {"lloyd_max", "minmax", "q_0", "q8_0"}, optional
        The scalar quantizer (:mod:`kvasym.minmax` for ``"minmax"``, :mod:`kvasym.blockq` for
        llama.cpp's ``"q_0"`` and ``"q8_0"``).
    axis : {"channel", "token"}, optional
        Direction of the groups of a grouped scalar (default ``"channel"``).
    group : int, optional
        Entries per group (default 32).
    normalize : {"none", "dual"}, optional
        ``dual``: before a ``minmax`` quantizer with ``axis: channel``, divide each token by its
        KVarN-style dual scale (alternating row and column variance normalization over each
        block of ``group`` tokens, :mod:`kvasym.dualscale`; one float16 per token stored, array
        ``token_scale``). Default ``none``.
    sketch_m : {1, 2}, optional
        Sketch rows per coordinate: ``m = d`` (1 bit per coordinate) or ``m = 2d`` (2 bits,
        Gaussian sketch only).
    rescale : {"none", "eden", "lsq", "norm"}, optional
        Scale correction of the lloyd_max reconstruction (:mod:`kvasym.rescale`; no sketch).
    spend_offset : int, optional
        ``k`` in ``spend: n-k``: the side spends ``n - k`` bits per coordinate in all
        (``scalar_bits + sketch bits = n - k``), ``k`` bits fewer than the budget, on purpose (an
        ablation: e.g. KQV's values without the sketch bit). Default 0: the side spends ``n``.
        Such a side is quantized as a side of budget ``n - k`` (:meth:`spent_at`), so its packed
        cache says so, and the frontier measures its lower rate.
    """

    rotate: bool
    scalar_offset: int
    qjl: bool
    sketch: str = "gaussian"
    center: bool = False
    transform: str | None = None
    transform_dtype: str = "float32"
    allocation: str = "uniform"
    scalar: str = "lloyd_max"
    axis: str = "channel"
    group: int = 32
    normalize: str = "none"
    sketch_m: int = 1
    rescale: str = "none"
    spend_offset: int = 0

    def __post_init__(self) -> None:
        _check_side(self, "side spec")

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

    def stores_nothing_at(self, budget: int) -> bool:
        """Whether this side keeps nothing at ``budget``: no scalar bit and no QJL sketch (a
        declared spend ``n - k`` does not change it: :meth:`spent_at` keeps the scalar bits).

        Parameters
        ----------
        budget : int
            Bits per coordinate ``n``.

        Returns
        -------
        bool
            ``scalar_bits(budget) == 0 and not qjl``; or llama.cpp's symmetric ``q8_0`` rule at
            1 bit (its one level is 0) without a sketch.
        """
        bits = self.scalar_bits(budget)
        return (bits == 0 or (bits == 1 and self.scalar == "q8_0")) and not self.qjl

    def spent_at(self, budget: int) -> tuple[SideSpec, int]:
        """The spec and budget this side is quantized with at the scheme's ``budget``: itself
        at ``budget`` when it spends the budget, else the same side at its own budget ``n - k``
        (``spend_offset`` 0, the scalar offset reduced by ``k``: the same scalar and sketch bits).

        Parameters
        ----------
        budget : int
            The scheme's budget ``n``.

        Returns
        -------
        tuple of (SideSpec, int)
        """
        if not self.spend_offset:
            return self, budget
        from dataclasses import replace

        return (replace(self, scalar_offset=self.scalar_offset - self.spend_offset, spend_offset=0),
                budget - self.spend_offset)

    @property
    def seeded_transform(self) -> bool:
        """The transform is drawn from the rotation seed (``wht`` or ``haar``): the seed is stored."""
        return self.transform in SEEDED_TRANSFORMS

    @property
    def sketch_bits(self) -> int:
        """Bits per coordinate the sketch spends: ``sketch_m`` with ``qjl``, else 0."""
        return self.sketch_m if self.qjl else 0

    @property
    def scalar_bits_expr(self) -> str:
        """The scalar width as written in config: ``"n"`` or ``"n-k"``."""
        return "n" if self.scalar_offset == 0 else f"n-{self.scalar_offset}"

    def primitives(self) -> dict:
        """The primitives that differ from the original pipeline (empty for the original four
        keys): what a packed cache's header records under ``primitives``.

        Returns
        -------
        dict
            A subset of ``center, transform, transform_dtype, allocation, scalar, axis, group,
            sketch_m, rescale`` (``transform`` only when ``klt``, ``transform_dtype`` only
            with ``klt``, ``axis`` and ``group`` only with ``minmax``).
        """
        out: dict = {}
        if self.center:
            out["center"] = True
        if self.transform == "klt":
            out["transform"] = "klt"
            out["transform_dtype"] = self.transform_dtype
        elif self.transform == "haar":
            out["transform"] = "haar"
        for key in ("allocation", "scalar", "sketch_m", "rescale"):
            if getattr(self, key) != _DEFAULTS[key]:
                out[key] = getattr(self, key)
        if self.scalar in GROUPED_SCALARS:
            out["axis"] = self.axis
            out["group"] = self.group
        if self.normalize != _DEFAULTS["normalize"]:
            out["normalize"] = self.normalize
        return out

    def to_dict(self) -> dict:
        """The config mapping ``{rotate, scalar_bits, qjl[, sketch][, primitives...]}`` of this
        side (inverse of parsing; ``sketch`` only when it is not the default ``gaussian``, a
        primitive only when it is not its default, ``transform: klt`` in place of ``rotate``)."""
        out: dict = {"rotate": self.rotate, "scalar_bits": self.scalar_bits_expr, "qjl": self.qjl}
        if self.transform in ("klt", "haar"):
            del out["rotate"]  # transform: klt (haar) says it
        if self.sketch != "gaussian":
            out["sketch"] = self.sketch
        for key, value in self.primitives().items():
            out[key] = "2d" if key == "sketch_m" else value
        if self.spend_offset:
            out[SPEND_KEY] = f"n-{self.spend_offset}"
        return out


def spec_of(rotate: bool, budget: int, scalar_bits: int, qjl: bool, sketch: str, primitives: Mapping) -> SideSpec:
    """The side spec a cache's header describes (raises KvasymError for an impossible record).

    Parameters
    ----------
    rotate : bool
        Header ``rotate``.
    budget, scalar_bits : int
        Header ``budget`` and ``scalar_bits``.
    qjl : bool
        Header ``qjl``.
    sketch : str
        Header ``sketch``.
    primitives : mapping
        Header ``primitives`` (see :meth:`~kvasym.schemes.SideSpec.primitives`).

    Returns
    -------
    SideSpec
    """
    unknown = set(primitives) - set(PRIMITIVE_KEYS)
    if unknown:
        raise KvasymError(f"unknown primitive(s) {sorted(unknown)}")
    spec = SideSpec(rotate=rotate, scalar_offset=budget - scalar_bits, qjl=qjl, sketch=sketch, **dict(primitives))
    if spec.primitives() != dict(primitives):
        raise KvasymError(f"primitives {dict(primitives)} are not in canonical form ({spec.primitives()})")
    return spec


def _check_side(spec: SideSpec, where: str) -> None:
    """Every primitive value known, and only combinations the pipeline implements."""
    from .klt import KLT_DTYPES
    from .minmax import MINMAX_AXES
    from .rescale import RESCALE_KINDS
    from .sketch import SKETCH_KINDS

    if spec.sketch not in SKETCH_KINDS:
        raise KvasymError(f"{where}: sketch must be one of {', '.join(SKETCH_KINDS)}, got {spec.sketch!r}")
    if spec.sketch != "gaussian" and not spec.qjl:
        raise KvasymError(f"{where}: sketch {spec.sketch!r} needs qjl: true (a side without a sketch has no "
                          "sketch kind)")
    if spec.transform is None:
        object.__setattr__(spec, "transform", "wht" if spec.rotate else "none")
    checks = (("transform", TRANSFORMS), ("transform_dtype", KLT_DTYPES), ("allocation", ALLOCATIONS),
              ("scalar", SCALARS), ("axis", MINMAX_AXES), ("rescale", RESCALE_KINDS), ("normalize", NORMALIZE))
    for key, allowed in checks:
        if getattr(spec, key) not in allowed:
            raise KvasymError(f"{where}.{key} must be one of {', '.join(allowed)}, got {getattr(spec, key)!r}")
    if not isinstance(spec.center, bool):
        raise KvasymError(f"{where}.center must be true or false, got {spec.center!r}")
    if spec.rotate != (spec.transform == "wht"):
        raise KvasymError(f"{where}: rotate {spec.rotate} contradicts transform {spec.transform!r} "
                          "(rotate: true is transform: wht)")
    if isinstance(spec.group, bool) or not isinstance(spec.group, int) or not 1 <= spec.group <= 1 << 20:
        raise KvasymError(f"{where}.group must be an integer in 1..{1 << 20}, got {spec.group!r}")
    if isinstance(spec.spend_offset, bool) or not isinstance(spec.spend_offset, int) or spec.spend_offset < 0:
        raise KvasymError(f"{where}.spend must be n or n-k (k >= 0 a whole number), got offset {spec.spend_offset!r}")
    if spec.sketch_m not in (1, 2):
        raise KvasymError(f"{where}.sketch_m must be d or 2d, got {spec.sketch_m!r}")
    if spec.sketch_m == 2 and (not spec.qjl or spec.sketch != "gaussian"):
        raise KvasymError(f"{where}.sketch_m 2d needs qjl: true and the gaussian sketch")
    if spec.allocation == "waterfill" and spec.scalar != "lloyd_max":
        raise KvasymError(f"{where}: allocation waterfill needs scalar lloyd_max (minmax has its own scales)")
    if spec.normalize == "dual" and (spec.scalar != "minmax" or spec.axis != "channel"):
        raise KvasymError(f"{where}: normalize dual needs scalar minmax with axis channel (its per-channel "
                          "groups absorb the column scales; module kvasym.dualscale)")
    if spec.rescale != "none" and (spec.scalar != "lloyd_max" or spec.qjl):
        raise KvasymError(f"{where}: rescale {spec.rescale} needs scalar lloyd_max and no sketch (qjl: false)")


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
            spent = scalar + spec.sketch_bits
            if spent != budget - spec.spend_offset:
                declared = (f"the declared spend n-{spec.spend_offset} = {budget - spec.spend_offset}"
                            if spec.spend_offset else f"the budget {budget}")
                raise KvasymError(
                    f"{where}: spends {spent} bits per coordinate "
                    f"({spec.scalar_bits_expr} scalar{f' + {spec.sketch_bits} QJL' if spec.qjl else ''}), "
                    f"not {declared}; every side must spend exactly n (or its declared spend n-k, never more)"
                )
            if spec.stores_nothing_at(budget):
                what = "no scalar bits" if scalar == 0 else f"a {scalar}-bit {spec.scalar} scalar (its one level is 0)"
                raise KvasymError(f"{where}: {what} and no QJL stores nothing")
            if scalar == 0 and (spec.scalar in GROUPED_SCALARS or spec.allocation == "waterfill"):
                raise KvasymError(f"{where}: scalar {spec.scalar} with allocation {spec.allocation} needs at "
                                  "least 1 scalar bit")

    def to_dict(self) -> dict:
        """The config mapping ``{K: {...}, V: {...}[, description]}`` of this scheme."""
        out = self.spec_dict()
        if self.description:
            out["description"] = self.description
        return out

    def spec_dict(self) -> dict:
        """``{K: {...}, V: {...}}``: what a job computes from, without the description, which
        only the paper's scheme table shows (a job's slice holds this, so editing a
        description reruns no job that quantizes)."""
        return {"K": self.K.to_dict(), "V": self.V.to_dict()}


_SIDE_KEYS = ("rotate", "scalar_bits", "qjl", "sketch", *PRIMITIVE_KEYS, SPEND_KEY)


def _parse_side(data: object, where: str) -> SideSpec:
    if not isinstance(data, Mapping):
        raise KvasymError(f"{where} must be a mapping with rotate (or transform), scalar_bits, qjl; got {data!r}")
    unknown = set(data) - set(_SIDE_KEYS)
    if unknown:
        raise KvasymError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(_SIDE_KEYS)}")
    for key in ("scalar_bits", "qjl"):
        if key not in data:
            raise KvasymError(f"{where}.{key} is missing")
    if "rotate" not in data and "transform" not in data:
        raise KvasymError(f"{where}.rotate is missing (give rotate: true/false, or transform: none/wht/klt)")
    for key in ("rotate", "qjl", "center"):
        if key in data and not isinstance(data[key], bool):
            raise KvasymError(f"{where}.{key} must be true or false, got {data[key]!r}")
    expr = data["scalar_bits"]
    match = _RELATIVE.match(expr.strip()) if isinstance(expr, str) else None
    if match is None:
        raise KvasymError(f"{where}.scalar_bits must be 'n' or 'n-k' (k a whole number), got {expr!r}")
    offset = int(match.group(1) or 0)
    spend = data.get(SPEND_KEY, "n")
    spend_match = _RELATIVE.match(spend.strip()) if isinstance(spend, str) else None
    if spend_match is None:
        raise KvasymError(f"{where}.{SPEND_KEY} must be 'n' or 'n-k' (k a whole number), got {spend!r}")
    spend_offset = int(spend_match.group(1) or 0)
    sketch = data.get("sketch", "gaussian")
    from .sketch import SKETCH_KINDS

    if sketch not in SKETCH_KINDS:
        raise KvasymError(f"{where}.sketch must be one of {', '.join(SKETCH_KINDS)}, got {sketch!r}")
    if "sketch" in data and not data["qjl"]:
        raise KvasymError(f"{where}.sketch is set but qjl is false: a side without a sketch has no sketch kind")
    transform = data.get("transform")
    if transform is not None and transform not in TRANSFORMS:
        raise KvasymError(f"{where}.transform must be one of {', '.join(TRANSFORMS)}, got {transform!r}")
    rotate = data.get("rotate", transform == "wht")
    if transform is not None and rotate != (transform == "wht"):
        raise KvasymError(f"{where}.rotate {rotate} contradicts {where}.transform {transform!r} "
                          "(rotate: true is transform: wht; give one of them)")
    if "transform_dtype" in data and transform != "klt":
        raise KvasymError(f"{where}.transform_dtype applies only to transform: klt")
    scalar = data.get("scalar", "lloyd_max")
    for key in ("axis", "group"):
        if key in data and scalar not in GROUPED_SCALARS:
            raise KvasymError(f"{where}.{key} applies only to scalar: {', '.join(GROUPED_SCALARS)}")
    if "normalize" in data and scalar != "minmax":
        raise KvasymError(f"{where}.normalize applies only to scalar: minmax")
    for key in ("transform_dtype", "allocation", "scalar", "axis", "normalize", "rescale"):
        if key in data and not isinstance(data[key], str):
            raise KvasymError(f"{where}.{key} must be a string, got {data[key]!r}")
    sketch_m = data.get("sketch_m", "d")
    if sketch_m not in SKETCH_M:
        raise KvasymError(f"{where}.sketch_m must be one of {', '.join(SKETCH_M)}, got {sketch_m!r}")
    if "sketch_m" in data and not data["qjl"]:
        raise KvasymError(f"{where}.sketch_m is set but qjl is false: a side without a sketch has no sketch size")
    group = data.get("group", _DEFAULTS["group"])
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise KvasymError(f"{where}.group must be a positive integer, got {group!r}")
    try:
        return _side_spec(data, rotate, offset, sketch, transform, scalar, sketch_m, group, spend_offset)
    except KvasymError as exc:
        raise KvasymError(str(exc).replace("side spec", where, 1)) from None


def _side_spec(data: Mapping, rotate: bool, offset: int, sketch: str, transform: str | None, scalar: str,
               sketch_m: str, group: int, spend_offset: int = 0) -> SideSpec:
    return SideSpec(
        rotate=rotate, scalar_offset=offset, qjl=data["qjl"], sketch=sketch,
        center=data.get("center", False), transform=transform if transform is not None else None,
        transform_dtype=data.get("transform_dtype", _DEFAULTS["transform_dtype"]),
        allocation=data.get("allocation", "uniform"), scalar=scalar, axis=data.get("axis", "channel"),
        group=group, normalize=data.get("normalize", "none"), sketch_m=2 if sketch_m == "2d" else 1,
        rescale=data.get("rescale", "none"),
        spend_offset=spend_offset,
    )


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
    # Built from the composable primitives; not in the paper's grid (usable from user configs
    # and ``kvasym quantize``).
    "KQV-H": {
        "description": "KQV with the orthogonal hadamard sketch on V",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False},
        "V": {"rotate": True, "scalar_bits": "n-1", "qjl": True, "sketch": "hadamard"},
    },
    "QKQV-H": {
        "description": "QKQV with the orthogonal hadamard sketch on K and V",
        "K": {"rotate": True, "scalar_bits": "n-1", "qjl": True, "sketch": "hadamard"},
        "V": {"rotate": True, "scalar_bits": "n-1", "qjl": True, "sketch": "hadamard"},
    },
    "CRKV": {
        "description": "RKV on centred blocks: the block mean stored once, then WHT and n-bit scalar",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False, "center": True},
        "V": {"rotate": True, "scalar_bits": "n", "qjl": False, "center": True},
    },
    "SKLT": {
        "description": "centre, the block's KLT basis (float16), n bits per coordinate on average by "
                       "reverse water-filling, Gaussian Lloyd-Max codebooks",
        "K": {"transform": "klt", "transform_dtype": "float16", "scalar_bits": "n", "qjl": False, "center": True,
              "allocation": "waterfill"},
        "V": {"transform": "klt", "transform_dtype": "float16", "scalar_bits": "n", "qjl": False, "center": True,
              "allocation": "waterfill"},
    },
    "KIVI32": {
        "description": "KIVI: group-wise asymmetric min-max, keys per channel and values per token, group 32, "
                       "float16 scales (no full-precision residual window)",
        "K": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "minmax", "axis": "channel", "group": 32},
        "V": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "minmax", "axis": "token", "group": 32},
    },
    "KIVI128": {
        "description": "KIVI32 with groups of 128",
        "K": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "minmax", "axis": "channel",
              "group": 128},
        "V": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "minmax", "axis": "token", "group": 128},
    },
    "GGML-Q0": {
        "description": "llama.cpp's q4_0 cache type at n = 4 (q5_0 at n = 5): blocks of 32 channels of a token, "
                       "one float16 scale from the block's extreme value, n-bit codes, no rotation",
        "K": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "q_0", "axis": "token", "group": 32},
        "V": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "q_0", "axis": "token", "group": 32},
    },
    "GGML-Q8": {
        "description": "llama.cpp's q8_0 cache type at n = 8: blocks of 32 channels of a token, one float16 "
                       "absmax scale, symmetric n-bit codes, no rotation",
        "K": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "q8_0", "axis": "token", "group": 32},
        "V": {"rotate": False, "scalar_bits": "n", "qjl": False, "scalar": "q8_0", "axis": "token", "group": 32},
    },
    # Issue 47, point 5: KVarN (arXiv:2606.03458) as its authors' kernel lays out a tile: WHT,
    # dual scaling over blocks of 128 tokens, per-channel min-max over the block; both sides.
    "KVarN": {
        "description": "KVarN-style: WHT, per-token dual scales (alternating row and column variance "
                       "normalization over blocks of 128 tokens, float16), per-channel min-max over the block",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False, "scalar": "minmax", "axis": "channel", "group": 128,
              "normalize": "dual"},
        "V": {"rotate": True, "scalar_bits": "n", "qjl": False, "scalar": "minmax", "axis": "channel", "group": 128,
              "normalize": "dual"},
    },
    "RKV-EDEN": {
        "description": "RKV with EDEN's unbiased scale 1/<z, c> folded into the stored norm",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False, "rescale": "eden"},
        "V": {"rotate": True, "scalar_bits": "n", "qjl": False, "rescale": "eden"},
    },
    # Issue 14, point 9 (ablation): KQV with its QJL sketch dropped, so V spends n-1 bits (fewer
    # than the budget, declared by spend: n-1); C1a's closed form says the sketch's error energy
    # (pi/2 - 1/d) |r|^2 exceeds the bare residual's |r|^2, so this beats KQV on values.
    # Issue 14, point 9 (ablation): a Haar-random rotation in place of the WHT.
    "HRKV": {
        "description": "RKV with a Haar-random orthogonal rotation (QR of a Gaussian matrix) in place of the WHT",
        "K": {"transform": "haar", "scalar_bits": "n", "qjl": False},
        "V": {"transform": "haar", "scalar_bits": "n", "qjl": False},
    },
    "HKQV": {
        "description": "KQV with a Haar-random orthogonal rotation in place of the WHT on both sides",
        "K": {"transform": "haar", "scalar_bits": "n", "qjl": False},
        "V": {"transform": "haar", "scalar_bits": "n-1", "qjl": True},
    },
    "KQV-NS": {
        "description": "KQV without the QJL sketch: WHT; K n-bit scalar; V (n-1)-bit scalar only (V spends n-1 bits)",
        "K": {"rotate": True, "scalar_bits": "n", "qjl": False},
        "V": {"rotate": True, "scalar_bits": "n-1", "qjl": False, "spend": "n-1"},
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
