"""The shared entry point of the stage scripts (stages/*.py): arguments, params, expected errors.

    # stages/corpus.py
    from electralab.cli import run_stage

    def main(params, args): ...

    if __name__ == "__main__":
        run_stage("corpus", main)

A stage with arguments of its own passes `arguments` (a function adding them to the parser).
Expected errors (bad configuration, bad input data, a diverged run, the same stage already running)
print `error: <message>` on stderr and exit with status 2, without a traceback; anything else is a bug
and keeps its traceback.

A stage holds a lock for its whole run (.electralab/locks/stage-<name>[@<run>].lock): DVC guards a stage's
outputs against a second `dvc repro`, but two direct runs of one stage script would write the same
outputs and scratch directory under each other; the second one stops at once, naming the first.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from electralab.config import Params, load_params
from electralab.env import repo_root
from electralab.errors import EXPECTED_ERRORS, StageBusy

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
        with stage_lock(name + (f"@{args.run}" if getattr(args, "run", None) else "")):
            body(load_params(args.params), args)
    except EXPECTED_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


@contextmanager
def stage_lock(stage: str) -> Iterator[None]:
    """Hold the stage's lock, or raise StageBusy naming the process that holds it (an OS lock: a killed
    stage releases it)."""
    path = repo_root() / ".electralab" / "locks" / f"stage-{stage}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise StageBusy(f"stage {stage} is already running in {path.parents[2]} ({lock.read().strip() or 'pid ?'}, "
                            f"lock {path}); wait for it to end, or stop it") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield
