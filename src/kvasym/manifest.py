"""Data manifests: what the data of one (distribution, dim) are, without storing them.

The data stage draws every trial of a (distribution, dim) from seeds keyed by its identity and
writes a manifest with a SHA-256 digest of each trial's K, V and Q and their descriptive
statistics (:func:`kvasym.cachestats.cache_statistics`). The arrays themselves are not stored:
regenerating them inside each later job is cheaper than reading them back, and the digest
guarantees that every job saw exactly the same data (:func:`verified_trial`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .distributions import DistributionSpec, TrialData, generate_trial
from .errors import DamagedFile, KvasymError

__all__ = ["DATA_FORMAT", "DATA_KEYS", "build_manifest", "load_manifest", "regenerate_trial", "trial_digest",
           "verified_trial"]

#: Version of the manifest layout; a manifest of another format is refused (rerun the data rule).
DATA_FORMAT = 1
#: The slice keys the data depend on (a manifest made for other values is stale).
DATA_KEYS = ("distribution", "dim", "seq_len", "n_queries", "trials", "base_seed")


def regenerate_trial(slice_: Mapping[str, Any], trial: int) -> TrialData:
    """The K, V and Q of one trial, drawn from the seed of (distribution, dim, trial)."""
    spec = DistributionSpec.from_dict(slice_["distribution"])
    return generate_trial(spec, slice_["dim"], slice_["seq_len"], slice_["n_queries"], slice_["base_seed"], trial)


def trial_digest(data: TrialData) -> str:
    """SHA-256 of a trial's float64 K, V and Q bytes (little-endian, C order)."""
    h = hashlib.sha256()
    for array in (data.keys, data.values, data.queries):
        h.update(np.ascontiguousarray(array, dtype="<f8").tobytes())
    return h.hexdigest()


def build_manifest(slice_: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest of one (distribution, dim): per trial its digest and K/V statistics."""
    from .cachestats import cache_statistics

    trials = []
    for trial in range(slice_["trials"]):
        data = regenerate_trial(slice_, trial)
        trials.append({"trial": trial, "sha256": trial_digest(data), "keys": cache_statistics(data.keys),
                       "values": cache_statistics(data.values)})
    return {"format": DATA_FORMAT, "slice": dict(slice_), "trials": trials}


def load_manifest(path: str | Path, slice_: Mapping[str, Any]) -> dict[str, str]:
    """Trial -> digest of a manifest, checked to be made for ``slice_``'s data keys."""
    try:
        manifest = json.loads(Path(path).read_text())
        digests = {int(t["trial"]): t["sha256"] for t in manifest["trials"]}
        made_for = {k: manifest["slice"].get(k) for k in DATA_KEYS}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedFile(path, f"unreadable data manifest ({type(exc).__name__}: {exc})") from None
    if manifest.get("format") != DATA_FORMAT or any(made_for[k] != slice_[k] for k in DATA_KEYS):
        raise KvasymError(f"{path}: data manifest was made for another config slice; rerun the data rule")
    return {str(k): v for k, v in digests.items()}


def verified_trial(slice_: Mapping[str, Any], trial: int, digests: Mapping[str, str]) -> TrialData:
    """:func:`regenerate_trial`, refused unless its digest equals the manifest's."""
    data = regenerate_trial(slice_, trial)
    if trial_digest(data) != digests.get(str(trial)):
        raise KvasymError(
            f"regenerated data of {slice_['distribution']['name']} d={slice_['dim']} trial {trial} "
            "differs from its manifest digest: the manifest was changed, or the generator is not "
            "deterministic on this machine; delete the manifest and rerun"
        )
    return data
