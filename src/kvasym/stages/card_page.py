"""Stage ``card_page`` (rule ``card_page``): the model card's HTML page from its JSON.

One small local job: reads ``card.json`` (stage ``card``) and writes the self-contained page of
:func:`kvasym.render.card_page.render_card_html`, its figures drawn by :mod:`kvasym.render.figures.card`.
It is a stage of its own so that an edit of the figures' style redraws the page (and the paper's
figures) without rerunning the card's passes or anything that reads its tables (the claims).
The page renders numbers the ``card`` stage computed; it recomputes none.
"""

from __future__ import annotations

import argparse

from ..artifacts import add_input_arguments

#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"card": "card_json"}


def run_card_page(card_json: str, out_html: str) -> None:
    """Write the HTML page of the card in ``card_json`` to ``out_html`` (atomically)."""
    import json

    from ..atomic import write_text_atomic
    from ..errors import DamagedFile, KvasymError
    from ..render.card_page import render_card_html

    try:
        with open(card_json, encoding="utf-8") as fh:
            card = json.load(fh)
    except OSError as exc:
        raise KvasymError(f"{card_json}: not a readable model card ({exc.strerror or exc})") from None
    except ValueError as exc:  # damaged: the DAG's own card.json is moved aside and rebuilt
        raise DamagedFile(card_json, f"not a readable model card ({exc})") from None
    write_text_atomic(render_card_html(card), out_html)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, INPUTS, required=tuple(INPUTS))
    parser.add_argument("--out", required=True, help="the card's HTML page")


def run(args: argparse.Namespace) -> None:
    run_card_page(args.card, args.out)
