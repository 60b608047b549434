"""The engine's choices on its command lines: `--choices JSON` read once into a Choices
(rbrules.choices: the document's schema, which the compiler writes through), and the facts of a
run the install's steps take beside it.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse

from rbrules.choices import Choices, ChoicesError
from rbrules.compression import compression_word


def _read(text: str) -> Choices:
    """--choices: the document, read once (argparse names the option when it is refused)."""
    try:
        return Choices.from_json(text)
    except ChoicesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_choices_option(parser: argparse.ArgumentParser) -> None:
    """--choices JSON: the spec's choices, read into a Choices (`engine receive`, and below)."""
    parser.add_argument(
        "--choices",
        type=_read,
        required=True,
        metavar="JSON",
        help="the spec's choices for the engine: one JSON document (rbkit/choices.py)",
    )


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--choices, and the facts of a run that the install's steps take beside it (`engine serve`,
    `engine run`, `rbkit.fanout node`)."""
    parser.add_argument("--dest", required=True)
    parser.add_argument("--old", default="", help="the source's path (what relocation rewrites)")
    parser.add_argument(
        "--compression",
        type=compression_word,
        default="none",
        help="the compression this run's stream uses",
    )
    parser.add_argument("--probe-config", default="", help="the checks' document (rbprobes)")
    add_choices_option(parser)
