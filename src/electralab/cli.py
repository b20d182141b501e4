"""The shared entry point of the stage scripts (stages/*.py): arguments, params, expected errors.

    # stages/corpus.py
    from electralab.cli import run_stage

    def main(params, args): ...

    if __name__ == "__main__":
        run_stage("corpus", main)

A stage with arguments of its own passes `arguments` (a function adding them to the parser).
Expected errors (bad configuration, bad input data, a diverged run) print `error: <message>` on
stderr and exit with status 2, without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from electralab.config import Params, load_params
from electralab.errors import EXPECTED_ERRORS

EXIT_BAD_INPUT = 2


def run_stage(name: str, body: Callable[[Params, argparse.Namespace], None], argv: list[str] | None = None,
              arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"stages/{name}.py",
                                     description=f"DVC stage `{name}` (see dvc.yaml and docs/).")
    parser.add_argument("--params", default="params.yaml", help="the params file (default: %(default)s)")
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    try:
        body(load_params(args.params), args)
    except EXPECTED_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
