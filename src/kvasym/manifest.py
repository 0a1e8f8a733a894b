"""Data manifests and the stored trials: what the data of one (distribution, dim) are.

The job of a (distribution, dim) unit (``kvasym stage cells``, or ``metrics`` for a query-model
variant) draws every trial of it from seeds keyed by its identity, quantizes and measures it
while it is in memory, and writes a manifest with a SHA-256 digest of each trial's K, V and Q
and their descriptive statistics (:func:`kvasym.cachestats.cache_statistics` of K and V; the
mean and median alignment of the queries with the keys' covariance,
:func:`kvasym.querymodel.query_alignment`). Stages that run after it (theory, figures)
regenerate the trials they use and check them against the manifest (:func:`verified_trial`):
the trials themselves are never stored (drawing a trial costs milliseconds to a tenth of a
second; the paper grid's trials took 2.9 GB on disk when they were).

A manifest carries its own digest, ``content_sha256``: the SHA-256 of the canonical JSON (sorted
keys, compact separators) of everything else in it. A manifest edited by hand (one statistic
changed) or corrupted fails it and is refused as a :class:`~kvasym.errors.DamagedFile`, which
``kvasym stage`` moves aside so that its unit job rebuilds it (:func:`read_manifest`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .distributions import DistributionSpec, TrialData, generate_trial
from .errors import DamagedFile, KvasymError

__all__ = ["CONTENT_DIGEST_KEY", "DATA_FORMAT", "DATA_KEYS", "build_manifest", "content_digest", "load_manifest",
           "manifest_of", "read_manifest", "regenerate_trial", "trial_digest", "trial_record", "verified_trial",
           "write_manifest"]

#: Version of the manifest layout; a manifest of another format is refused as damaged (so the data
#: rule rebuilds it). 2: the manifest carries its own digest (:data:`CONTENT_DIGEST_KEY`).
DATA_FORMAT = 2
#: The key of a manifest's digest of the rest of its content (:func:`content_digest`).
CONTENT_DIGEST_KEY = "content_sha256"
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
        h.update(np.ascontiguousarray(array, dtype="<f8"))  # the buffer itself: no copy to bytes
    return h.hexdigest()


def content_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, compact separators, NaN as ``NaN``) of a
    manifest without its :data:`CONTENT_DIGEST_KEY`: the same bytes whatever the order in
    which its keys were filled or the job that wrote it."""
    body = {k: v for k, v in manifest.items() if k != CONTENT_DIGEST_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def build_manifest(
    slice_: Mapping[str, Any], sink: Callable[[int, TrialData], None] | None = None
) -> dict[str, Any]:
    """The manifest of one (distribution, dim): per trial its digest and K/V statistics, and
    the digest of all that (:data:`CONTENT_DIGEST_KEY`). ``sink(trial, data)``, when given,
    receives each trial's data as it is drawn (:func:`write_trials` stores them)."""
    records = []
    for trial in range(slice_["trials"]):
        data = regenerate_trial(slice_, trial)
        if sink is not None:
            sink(trial, data)
        records.append(trial_record(trial, data))
    return manifest_of(slice_, records)


def trial_record(trial: int, data: TrialData) -> dict[str, Any]:
    """One trial's entry of a manifest: its digest (:func:`trial_digest`), the statistics of its
    K and V (:func:`kvasym.cachestats.cache_statistics`) and the queries' mean and median
    alignment with the keys' covariance (:func:`kvasym.querymodel.query_alignment`)."""
    from .cachestats import cache_statistics
    from .querymodel import query_alignment

    alignment = query_alignment(data.queries, data.keys)
    return {"trial": trial, "sha256": trial_digest(data), "keys": cache_statistics(data.keys),
            "values": cache_statistics(data.values),
            "queries": {"alignment": _finite_mean(alignment), "alignment_median": _finite_median(alignment)}}


def manifest_of(slice_: Mapping[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest of ``slice_`` from its trials' :func:`trial_record` entries, in trial order
    (a unit job that measured its trials on workers collects their records), with its digest."""
    if [record["trial"] for record in records] != list(range(slice_["trials"])):
        raise KvasymError(f"a manifest needs the records of trials 0..{slice_['trials'] - 1} in order, got "
                          f"{[record['trial'] for record in records]}")
    # through JSON once, so the digest is of exactly what a reader parses (tuples as lists, keys as text)
    manifest = json.loads(json.dumps({"format": DATA_FORMAT, "slice": dict(slice_), "trials": records}))
    manifest[CONTENT_DIGEST_KEY] = content_digest(manifest)
    return manifest


def _finite_mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.mean(finite)) if finite.size else None


def _finite_median(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else None


def _parse_manifest(path: str | Path) -> dict[str, Any]:
    """A manifest file parsed, a JSON object of this :data:`DATA_FORMAT` (its digest not checked yet)."""
    p = Path(path)
    if not p.exists():
        raise KvasymError(f"{p}: no such data manifest (run its unit job: rule cells, or metrics for a variant)")
    try:
        manifest = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DamagedFile(p, f"unreadable data manifest ({type(exc).__name__}: {exc})") from None
    if not isinstance(manifest, dict):
        raise DamagedFile(p, f"unreadable data manifest (a JSON {type(manifest).__name__}, not an object)")
    if manifest.get("format") != DATA_FORMAT:
        raise DamagedFile(p, f"data manifest of format {manifest.get('format')!r}, not {DATA_FORMAT} (an older "
                             "layout); its unit job rebuilds it")
    return manifest


def _check_content_digest(path: str | Path, manifest: Mapping[str, Any]) -> None:
    stored = manifest.get(CONTENT_DIGEST_KEY)
    if stored is None:
        raise DamagedFile(path, f"data manifest without its digest ({CONTENT_DIGEST_KEY}); its unit job rebuilds it")
    if stored != content_digest(manifest):
        raise DamagedFile(path, "data manifest: its content does not match its digest (edited or corrupted); "
                                "its unit job rebuilds it")


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A data manifest, parsed and checked against its own digest (the reader for every use of
    a manifest's content, e.g. its statistics in a table).

    A file that is not a JSON object, is of another :data:`DATA_FORMAT` (an older layout), lacks
    its :data:`CONTENT_DIGEST_KEY` or whose content does not match it (edited by hand or
    corrupted) raises :class:`~kvasym.errors.DamagedFile` naming it: its unit job rebuilds it.
    A missing file raises a plain :class:`~kvasym.errors.KvasymError`.
    """
    manifest = _parse_manifest(path)
    _check_content_digest(path, manifest)
    return manifest


def load_manifest(path: str | Path, slice_: Mapping[str, Any]) -> dict[str, str]:
    """Trial -> digest of a manifest (:func:`read_manifest`), checked to be made for
    ``slice_``'s data keys; one made for another slice is a :class:`~kvasym.errors.DamagedFile`
    (moved aside and rebuilt, not refused on every run)."""
    manifest = _parse_manifest(path)
    try:
        digests = {int(t["trial"]): t["sha256"] for t in manifest["trials"]}
        made_for = {k: manifest["slice"].get(k) for k in DATA_KEYS}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedFile(path, f"unreadable data manifest ({type(exc).__name__}: {exc})") from None
    # compared as JSON, as the manifest stores it (a tuple in the slice is a list in the file)
    wanted = json.loads(json.dumps({k: slice_[k] for k in DATA_KEYS}))
    stale = [k for k in DATA_KEYS if made_for[k] != wanted[k]]
    if stale:
        raise DamagedFile(path, f"data manifest was made for another config slice (differs in {', '.join(stale)}); "
                                "its unit job rebuilds it")
    _check_content_digest(path, manifest)
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


def write_manifest(slice_: Mapping[str, Any], manifest_json: str | os.PathLike,
                   sink: Callable[[int, TrialData], None] | None = None) -> dict[str, Any]:
    """Draw the data of ``slice_`` once and write its manifest (:func:`build_manifest`, returned)
    to ``manifest_json`` atomically; ``sink(trial, data)`` receives each trial as it is drawn."""
    from .atomic import write_json_atomic

    manifest = build_manifest(slice_, sink)
    write_json_atomic(manifest, manifest_json)
    return manifest
