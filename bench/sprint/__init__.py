"""The GPU sprint's parts (bench/gpu_sprint.py is the command; docs/scaling.md, "The GPU sprint").

    config.py   the sprint's settings (state/sprint.json) and the runs it trains, resolved from params.yaml
    bundle.py   CPU side: the preset's shards, vocabulary and GLUE files packed into the carry; GPU side: unpacked
    probe.py    the step time, tokens/s and MFU of each method's pretraining, measured before anything trains
    plan.py     equal GPU-seconds per method, packed into whole pieces of one command each
    trials.py   fine-tuning without Ray: the preset's grid x the sprint's seeds in worker processes
    table.py    the results table (CSV + Markdown) beside the published small-model numbers
    piece.py    one command: continue from the state, stop inside the time limit, hand the state back

Folders (all under .sprint/, git-ignored): carry/ (the data, carried to the GPU machine), state/ (small:
plan, results, run log; it comes back through $OUT and is carried again), work/ (unpacked data, models,
checkpoints: large, it stays on the machine that made it), prep/ (the CPU side's data stages).
"""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path
from typing import Callable

from electralab.errors import DataError

SPRINT_DIR = ".sprint"
CLOCK_ENV = "ELECTRALAB_SPRINT_CLOCK"


def clock() -> Callable[[], float]:
    """The clock that budgets are kept in: the wall (time.monotonic) on the GPU machine. With
    ELECTRALAB_SPRINT_CLOCK=cpu, this process's CPU seconds: a dry run on a shared CPU, where the wall clock
    would measure the neighbours' load, keeps its few-second commands that way (one worker: the CPU of
    worker processes is not counted)."""
    mode = os.environ.get(CLOCK_ENV, "wall")
    if mode not in ("wall", "cpu"):
        raise ValueError(f"{CLOCK_ENV}={mode!r}: choose wall or cpu")
    return time.process_time if mode == "cpu" else time.monotonic


def sprint_dir(root: Path) -> Path:
    return Path(root) / SPRINT_DIR


def carry_dir(root: Path) -> Path:
    return sprint_dir(root) / "carry"


def state_dir(root: Path) -> Path:
    return sprint_dir(root) / "state"


def work_dir(root: Path) -> Path:
    return sprint_dir(root) / "work"


def prep_dir(root: Path) -> Path:
    return sprint_dir(root) / "prep"


def extract(archive: Path, mode: str, target: Path) -> None:
    """Unpack one of the sprint's own tarballs (plain files and folders) into `target`, refusing any member
    that is not one or would land outside it. tarfile's "data" filter does that where Python has it
    (3.11.4 on); the project allows any 3.11, and Debian's is 3.11.2, so the same rule is checked here too."""
    root = Path(target).resolve()
    with tarfile.open(archive, mode) as tar:
        for member in tar.getmembers():
            inside = root == (root / member.name).resolve() or root in (root / member.name).resolve().parents
            if not (member.isfile() or member.isdir()) or not inside:
                raise DataError(f"{archive}: member {member.name!r} is not a plain file or folder inside the archive")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, filter="data")
        else:
            tar.extractall(root)
