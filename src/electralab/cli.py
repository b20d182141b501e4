"""The shared entry point of the stage scripts (stages/*.py): arguments, params, expected errors.

    # stages/corpus.py
    from electralab.cli import run_stage

    def main(params, args): ...

    if __name__ == "__main__":
        run_stage("corpus", main)

A stage with arguments of its own passes `arguments` (a function adding them to the parser).
Expected errors (bad configuration, bad input data, a diverged run) print `error: <message>` on
stderr and exit with status 2, without a traceback; anything else is a bug and keeps its traceback.

Before the stage's work, two environment knobs (docs/operations.md):
    ELECTRALAB_THREADS   torch threads (and OMP_NUM_THREADS); default: OMP_NUM_THREADS if set, else the CPUs
                         this process may run on (its affinity, capped by a cgroup CPU quota). torch's own
                         default is every core, which oversubscribes a shared or busy machine.
    ELECTRALAB_VERBOSE=1 keep the libraries' INFO lines (MLflow's database migrations and system-metrics
                         monitor, Ray's token-auth notice); by default only their warnings and errors show.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path
from typing import Callable

from electralab.config import Params, load_params
from electralab.errors import EXPECTED_ERRORS

EXIT_BAD_INPUT = 2
THREADS_ENV, VERBOSE_ENV = "ELECTRALAB_THREADS", "ELECTRALAB_VERBOSE"
# Library loggers whose INFO lines drown a stage's own output, and the level they get unless verbose.
QUIET = {"mlflow": logging.WARNING, "alembic": logging.WARNING,
         "ray._private.authentication.authentication_token_setup": logging.ERROR}


def cpus_given() -> int:
    """The CPUs this process may use: its affinity (taskset, a cpuset), capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def set_threads() -> int:
    """torch's intra-op threads for this stage (see the module docstring); returns the count."""
    threads = int(os.environ.get(THREADS_ENV) or os.environ.get("OMP_NUM_THREADS") or cpus_given())
    os.environ["OMP_NUM_THREADS"] = str(threads)   # torch reads it at import; Ray trials set their own
    if "torch" in sys.modules:                     # imported already: tell it directly
        sys.modules["torch"].set_num_threads(threads)
    return threads


def quiet_libraries() -> None:
    """Libraries' INFO lines off unless ELECTRALAB_VERBOSE is set (see the module docstring)."""
    if os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes"):
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")   # MLflow configures its loggers at import
    for name, level in QUIET.items():
        logging.getLogger(name).setLevel(level)


def run_stage(name: str, body: Callable[[Params, argparse.Namespace], None], argv: list[str] | None = None,
              arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"stages/{name}.py",
                                     description=f"DVC stage `{name}` (see dvc.yaml and docs/).")
    parser.add_argument("--params", default="params.yaml", help="the params file (default: %(default)s)")
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    set_threads()
    quiet_libraries()
    try:
        body(load_params(args.params), args)
    except EXPECTED_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
