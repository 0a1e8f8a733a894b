"""Seeds derived from a cell's identity, never from execution order.

Every random draw in the study (data, rotation signs, QJL matrices, bootstrap resamples) comes
from a :class:`numpy.random.SeedSequence` whose entropy is the base seed and whose spawn key is a
stable hash of the identity tuple, e.g. ``("data", "gaussian", 128, 3)``. The same identity gives
the same stream on every machine, for every scheme and budget (a paired design), whatever the
job order or the number of cores.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .errors import KvasymError

Identity = tuple[str | int, ...]


def identity_words(identity: Identity) -> tuple[int, ...]:
    """Stable 32-bit words from an identity tuple (sha256 of its canonical repr).

    Python's ``hash`` is salted per process, so it cannot be used; ints and strings are
    tagged so that ``("1",)`` and ``(1,)`` differ.
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
    """The SeedSequence of one identity under one base seed."""
    # A user-supplied value (config base_seed, CLI --seed): KvasymError, a ValueError subclass.
    if isinstance(base_seed, bool) or not isinstance(base_seed, (int, np.integer)) or base_seed < 0:
        raise KvasymError(f"base seed must be a non-negative integer, got {base_seed!r}")
    return np.random.SeedSequence(entropy=int(base_seed), spawn_key=identity_words(identity))


def rng(base_seed: int, *identity: str | int) -> np.random.Generator:
    """A PCG64 generator for one identity under one base seed."""
    return np.random.Generator(np.random.PCG64(seed_sequence(base_seed, *identity)))


def derived_seed(base_seed: int, *identity: str | int) -> int:
    """A 63-bit integer seed for one identity (stored in packed caches to rebuild draws)."""
    state = seed_sequence(base_seed, *identity).generate_state(2, dtype=np.uint32)
    return (int(state[0]) | (int(state[1]) << 32)) & ((1 << 63) - 1)
