"""Stage ``card_page`` (rule ``card_page``): the model card, as JSON and as one HTML page.

One small local job per model: reads what the card's passes measured (stage ``card``: its
``measurements.json``, its summary and comparisons) and the model's rows of the end-to-end
summary (stage ``e2e_stats``), completes the card with its frontier and recommendations
(:func:`kvasym.real.card.complete_card`), and writes ``card.json`` and the self-contained page of
:func:`kvasym.render.card_page.render_card_html`, its figures drawn by
:mod:`kvasym.render.figures.card`.

It is a stage of its own so that the card's passes (minutes) do not wait for every end-to-end
job: they need the calibration texts' sensitivities only, and the end-to-end summary joins the
card here, in a job of a second (an overlay that adds long-context passes, which rewrites the
end-to-end tables, reruns this job and not the card's passes); and so that an edit of the
figures' style redraws the page without rerunning the passes or anything that reads their
tables (the claims). The page renders numbers the ``card`` and ``e2e_stats`` stages computed; it
recomputes none.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments

#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"measurements": "card_measurements", "summary": "card_summary", "comparisons": "card_comparisons",
          "e2e_summary": "e2e_summary"}

OUTPUTS = ("json", "html")


def read_measurements(path: str) -> dict[str, Any]:
    """The card measurements (a JSON object with ``settings``) in ``path``; a KvasymError naming
    the file when it cannot be read, and a :class:`kvasym.errors.DamagedFile` when it is not
    such an object (the DAG's own file is moved aside and rebuilt)."""
    import json

    from ..errors import DamagedFile, KvasymError

    try:
        with open(path, encoding="utf-8") as fh:
            card = json.load(fh)
    except OSError as exc:
        raise KvasymError(f"{path}: not a readable card measurement ({exc.strerror or exc})") from None
    except ValueError as exc:  # damaged: the DAG's own file is moved aside and rebuilt
        raise DamagedFile(path, f"not a readable card measurement ({exc})") from None
    if not isinstance(card, dict) or "settings" not in card:
        raise DamagedFile(path, "not a readable card measurement (a JSON object with settings expected)")
    return card


def run_card_page(measurements: str, summary: str, comparisons: str, e2e_summary: str, out: dict[str, str]) -> None:
    """Write the card to ``out["json"]`` and its page to ``out["html"]`` (each atomically; the
    page last). Its model is the one the card's own ``summary`` was measured on (its provenance,
    :func:`kvasym.real.models.text_model`); that model's rows of ``e2e_summary``, the other
    schemes' passes, are the frontier beside the card's own rows."""
    import json

    import pandas as pd

    from ..atomic import write_text_atomic
    from ..dataset import read_parquet_checked
    from ..real.card import complete_card
    from ..real.models import model_rows, text_model
    from ..render.card_page import render_card_html

    measured = read_measurements(measurements)
    reference = str(measured["settings"]["reference"])
    own = read_parquet_checked(summary)
    frontier = model_rows(read_parquet_checked(e2e_summary), text_model(summary))
    frontier = pd.concat([frontier[frontier["scheme"] != reference], own], ignore_index=True)
    card = complete_card(measured, frontier, read_parquet_checked(comparisons),
                         [int(b) for b in measured["settings"]["budgets"]])
    write_text_atomic(json.dumps(card, indent=1, sort_keys=True) + "\n", out["json"])
    write_text_atomic(render_card_html(card), out["html"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, INPUTS, required=tuple(INPUTS))
    for name in OUTPUTS:
        parser.add_argument(f"--out-{name}", required=True, help=f"the card ({name})")


def run(args: argparse.Namespace) -> None:
    run_card_page(args.measurements, args.summary, args.comparisons, args.e2e_summary,
                  {name: getattr(args, f"out_{name}") for name in OUTPUTS})
