"""Stage ``capture`` (rule ``capture``): real K, V and queries of SmolLM2-135M for shipped texts.

Runs the model on each text (:func:`kvasym.real.capture.run_capture`) and stores every layer's
keys before and after RoPE, values and queries in one ``.npz`` per text with a JSON sidecar.
The same flags as the user command ``kvasym capture``. Needs the real-model extra.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..real.capture import add_arguments as capture_arguments  # numpy only: the model loads lazily

    capture_arguments(parser)


def run(args: argparse.Namespace) -> None:
    from ..real.capture import run_from_args

    run_from_args(args)
