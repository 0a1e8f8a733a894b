"""Seeds derived from a cell's identity, never from execution order.

Every random draw in the study (data, rotation signs, QJL matrices, bootstrap resamples) comes
from a :class:`numpy.random.SeedSequence` whose entropy is the base seed and whose spawn key is a
stable hash of the identity tuple, e.g. ``("data", "gaussian", 128, 3)``. The same identity gives
the same stream on every machine, for every scheme and budget (a paired design), whatever the
job order or the number of cores.

References
----------
.. [1] O'Neill, M. E. (2014) "PCG: A family of simple fast space-efficient statistically good
   algorithms for random number generation", Harvey Mudd College, HMC-CS-2014-0905 (the PCG64
   generator behind :func:`rng`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .errors import KvasymError

__all__ = ["Identity", "identity_words", "seed_sequence", "rng", "derived_seed"]

Identity = tuple[str | int, ...]


def identity_words(identity: Identity) -> tuple[int, ...]:
    """Stable 32-bit words from an identity tuple (sha256 of its canonical repr).

    Python's ``hash`` is salted per process, so it cannot be used; ints and strings are
    tagged so that ``("1",)`` and ``(1,)`` differ.

    Parameters
    ----------
    identity : tuple of (str or int)
        The identity of a random stream, e.g. ``("rotation", "gaussian", 128, 3, "K")``. The
        order of the items matters.

    Returns
    -------
    tuple of int
        Eight integers in ``[0, 2**32)``: the sha256 digest read as little-endian 32-bit words.

    Raises
    ------
    TypeError
        If an item is not an ``int`` or a ``str`` (``bool`` and numpy integers are refused too).

    Notes
    -----
    Each item becomes ``"i:<decimal>"`` (int) or ``"s:<text>"`` (str); the parts are joined with
    the unit separator ``"\\x1f"``, encoded as UTF-8 and hashed:
    ``words = sha256(join(parts))`` split into ``digest[4k : 4k + 4]``, ``k = 0..7``.
    """
    parts = []
    for item in identity:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise TypeError(f"seed identity items must be int or str, got {item!r}")
        tag = "i" if isinstance(item, int) else "s"
        parts.append(f"{tag}:{item}")
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return tuple(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4))


def seed_sequence(base_seed: int, *identity: str | int) -> np.random.SeedSequence:
    """The SeedSequence of one identity under one base seed.

    Parameters
    ----------
    base_seed : int
        The study's base seed (a non-negative Python or numpy integer).
    *identity : str or int
        The identity items (see :func:`identity_words`).

    Returns
    -------
    numpy.random.SeedSequence
        ``SeedSequence(entropy=base_seed, spawn_key=identity_words(identity))``.

    Raises
    ------
    KvasymError
        If ``base_seed`` is not a non-negative integer (``bool`` is refused).
    TypeError
        If an identity item is not an ``int`` or a ``str``.
    """
    # A user-supplied value (config base_seed, CLI --seed): KvasymError, a ValueError subclass.
    if isinstance(base_seed, bool) or not isinstance(base_seed, (int, np.integer)) or base_seed < 0:
        raise KvasymError(f"base seed must be a non-negative integer, got {base_seed!r}")
    return np.random.SeedSequence(entropy=int(base_seed), spawn_key=identity_words(identity))


def rng(base_seed: int, *identity: str | int) -> np.random.Generator:
    """A PCG64 generator for one identity under one base seed.

    Parameters
    ----------
    base_seed : int
        The study's base seed (a non-negative integer).
    *identity : str or int
        The identity items (see :func:`identity_words`).

    Returns
    -------
    numpy.random.Generator
        ``Generator(PCG64(seed_sequence(base_seed, *identity)))``: the same stream for the
        same arguments on every machine.

    Raises
    ------
    KvasymError
        If ``base_seed`` is not a non-negative integer.
    TypeError
        If an identity item is not an ``int`` or a ``str``.

    References
    ----------
    .. [1] O'Neill, M. E. (2014) "PCG: A family of simple fast space-efficient statistically
       good algorithms for random number generation", HMC-CS-2014-0905.
    """
    return np.random.Generator(np.random.PCG64(seed_sequence(base_seed, *identity)))


def derived_seed(base_seed: int, *identity: str | int) -> int:
    """A 63-bit integer seed for one identity (stored in packed caches to rebuild draws).

    Parameters
    ----------
    base_seed : int
        The study's base seed (a non-negative integer).
    *identity : str or int
        The identity items (see :func:`identity_words`).

    Returns
    -------
    int
        An integer in ``[0, 2**63)``. The rotation signs and the QJL matrix are drawn from
        ``Generator(PCG64(seed))`` with this seed.

    Raises
    ------
    KvasymError
        If ``base_seed`` is not a non-negative integer.
    TypeError
        If an identity item is not an ``int`` or a ``str``.

    Notes
    -----
    With ``w0, w1`` the first two uint32 words of ``seed_sequence(base_seed, *identity)
    .generate_state(2)``: ``seed = (w0 + 2**32 w1) mod 2**63``.
    """
    state = seed_sequence(base_seed, *identity).generate_state(2, dtype=np.uint32)
    return (int(state[0]) | (int(state[1]) << 32)) & ((1 << 63) - 1)
