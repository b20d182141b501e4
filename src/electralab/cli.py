"""The shared entry point of the stage scripts (stages/*.py): arguments, params, expected errors.

    # stages/vocab.py: dvc.yaml runs `python stages/vocab.py data/corpus data/vocab metrics/vocab.json`
    from electralab.cli import run_stage

    def main(params, args): ...          # args.corpus, args.out, args.metrics

    def arguments(parser):
        parser.add_argument("corpus", type=Path, help="the corpus directory (the corpus stage's output)")
        ...

    if __name__ == "__main__":
        run_stage("vocab", main, arguments=arguments)

A stage takes every path it reads or writes from its command line, so that dvc.yaml names each one once, in
the stage's `cmd` beside its deps and outs, and a stage runs by hand with the same arguments; relative paths
are the working directory's (the project root, where DVC runs stages). `arguments` adds them to the parser.
Expected errors (bad configuration, bad input data, a diverged run, the same stage already running, a full
disk) print `error: <message>` on stderr and exit with status 2, without a traceback; anything else is a bug
and keeps its traceback.

A stop signal ends a stage with one line and no traceback: SIGTERM (`kill`, `timeout`, systemd, a container's
stop) and SIGINT (Ctrl-C). A stage that polls `STOP.requested()` (pretraining, after every step) finishes the
step, checkpoints it and says which step the next run resumes from; any other stage stops where it is, keeping
only what it finished (every output is written whole or not at all). A signal that comes while the stage script
is still importing (torch, Ray, MLflow: seconds) is held until the stage can stop in its line; a stage script
imports this module first for that. A second signal stops at once. The exit
status is the shell's for the signal (128 + its number), so DVC records nothing and `dvc repro` runs it again.

A stage holds a lock for its whole run (.electralab/locks/stage-<name>[@<run>].lock): DVC guards a stage's
outputs against a second `dvc repro`, but two direct runs of one stage script would write the same
outputs and scratch directory under each other; the second one stops at once, naming the first.

Before the stage's work, two environment knobs (docs/operations.md):
    ELECTRALAB_THREADS   torch threads (and OMP_NUM_THREADS); default: OMP_NUM_THREADS if set, else the CPUs
                         this process may run on (its affinity, capped by a cgroup CPU quota). torch's own
                         default is every core, which oversubscribes a shared or busy machine.
    ELECTRALAB_VERBOSE=1 keep the libraries' INFO lines (MLflow's database migrations and system-metrics
                         monitor, Ray's token-auth notice); by default only their warnings and errors show.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import math
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, NoReturn

from electralab.config import Params, load_params
from electralab.env import repo_root
from electralab.errors import EXIT_BAD_INPUT, EXPECTED_ERRORS, StageBusy, Stopped, stopped_by
from electralab.io import disk_full

THREADS_ENV, VERBOSE_ENV = "ELECTRALAB_THREADS", "ELECTRALAB_VERBOSE"
# Library loggers whose INFO lines drown a stage's own output, and the level they get unless verbose.
QUIET = {
    "mlflow": logging.WARNING,
    "alembic": logging.WARNING,
    "ray._private.authentication.authentication_token_setup": logging.ERROR,
}


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
    os.environ["OMP_NUM_THREADS"] = str(threads)  # torch reads it at import; Ray trials set their own
    if "torch" in sys.modules:  # imported already: tell it directly
        sys.modules["torch"].set_num_threads(threads)
    return threads


def quiet_libraries() -> None:
    """Libraries' INFO lines off unless ELECTRALAB_VERBOSE is set (see the module docstring)."""
    if os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes"):
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow configures its loggers at import
    for name, level in QUIET.items():
        logging.getLogger(name).setLevel(level)


class StopSignals:
    """SIGTERM and SIGINT for a stage (see the module docstring): the first one raises Stopped where the stage
    is, unless the stage polls `requested()`, which then answers True at its next poll."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.polled = False
        self.pid = os.getpid()  # the stage's process: a forked child keeps the handlers but not this role
        self.held: int | None = None  # a signal received while the stage script was still importing

    def hold_while_starting(self) -> None:
        """From a stage script's import of this module until run_stage installs the stage's handlers, the stage is
        still importing torch, Ray or MLflow and has done nothing: a stop signal then is held, and ends the stage in
        its one line as soon as run_stage can name it (a traceback from inside an import otherwise). A second one
        ends the process at once."""
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._held)

    def _held(self, signum: int, frame) -> None:
        if self.held is not None:
            os._exit(128 + signum)
        self.held = signum

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers for the stage's run; the process's own ones again after it (a stage run in-process)."""
        self.signum, self.polled, self.pid = None, False, os.getpid()
        if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
            yield
            return
        before = {signum: signal.signal(signum, self._received) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            if self.held is not None:  # stopped while the stage script was importing
                signum, self.held = self.held, None
                raise Stopped(f"stopped by {signal.Signals(signum).name}", signum)
            yield
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)

    def requested(self) -> bool:
        self.polled = True
        return self.signum is not None

    def _received(self, signum: int, frame) -> None:
        if os.getpid() != self.pid:  # a forked child (a process pool's worker, which its pool ends with SIGTERM)
            signal.signal(signum, signal.SIG_DFL)  # ends as it would without these handlers
            os.kill(os.getpid(), signum)
            return
        first, self.signum = self.signum is None, signum
        if not (first and self.polled):
            raise Stopped(f"stopped by {signal.Signals(signum).name}", signum)


STOP = StopSignals()
if Path(getattr(sys.modules["__main__"], "__file__", None) or "").parent.name == "stages":  # python stages/<name>.py
    STOP.hold_while_starting()


def run_stage(
    name: str,
    body: Callable[[Params, argparse.Namespace], None],
    argv: list[str] | None = None,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    parser = argparse.ArgumentParser(
        prog=f"stages/{name}.py", description=f"DVC stage `{name}` (see dvc.yaml and docs/)."
    )
    parser.add_argument("--params", default="params.yaml", help="the params file (default: %(default)s)")
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    set_threads()
    quiet_libraries()
    stage = name + (f"@{args.run}" if getattr(args, "run", None) else "")
    try:
        with STOP.installed(), stage_lock(stage):
            body(load_params(args.params), args)
    except EXPECTED_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except Stopped as e:
        stopped(stage, e)
    except Exception as e:
        if (stop := stopped_by(e)) is not None:  # a stop signal that a library wrapped (Ray's ray.wait)
            stopped(stage, stop)
        if (full := disk_full(e)) is None:
            raise  # a bug: its traceback
        print(
            f"error: {stage}: {full}; free some space and run the same command again (`dvc repro`, `make repro`): "
            "finished outputs and the last checkpoint are kept",
            file=sys.stderr,
        )
        sys.exit(EXIT_BAD_INPUT)


def stopped(stage: str, e: Stopped) -> NoReturn:
    print(f"{stage}: {e}; run the same command again (`dvc repro`, `make repro`) to go on", file=sys.stderr)
    sys.exit(128 + e.signum)


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
            raise StageBusy(
                f"stage {stage} is already running in {path.parents[2]} ({lock.read().strip() or 'pid ?'}, "
                f"lock {path}); wait for it to end, or stop it"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield
