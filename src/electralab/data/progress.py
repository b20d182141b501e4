"""Progress for the long steps (data stages, pretraining, fine-tuning grids) and one-line summaries, on stderr.

On a terminal a tqdm bar, redrawn in place. Anywhere else (a log file, CI, a Prefect worker, `nohup`) a bar
would be one endless line of carriage returns, so the same numbers come as a plain line every
$ELECTRALAB_PROGRESS_EVERY seconds (default 30) and once at the end; a step shorter than that prints nothing
but its summary.

    with progress_bar(total=steps, desc="pretrain cocolm", unit="step") as bar: ...
    # non-terminal: "pretrain cocolm:  40%| 40/100 [01:00<01:30, 0.67step/s, loss=6.9]"
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

PROGRESS_EVERY_ENV = "ELECTRALAB_PROGRESS_EVERY"
DEFAULT_EVERY_S = 30.0


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PlainProgress(tqdm):
    """tqdm's counts as plain lines, at most one per `mininterval` seconds and one at the end (see above)."""

    def display(self, msg=None, pos=None):
        if msg == "":
            return True
        closing = self.disable  # close() sets it first, then writes the last line's newline itself
        now = self._time()
        if not closing:  # updates and set_postfix() both land here: one line per interval
            # start_t: not there yet when tqdm draws in __init__ (no delay: ELECTRALAB_PROGRESS_EVERY=0)
            if now - getattr(self, "_last_line", getattr(self, "start_t", now)) < self.mininterval:
                return True
            self._last_line = now
        line = (msg if msg is not None else self.format_meter(**{**self.format_dict, "ncols": 0})).strip()
        self.fp.write(line if closing else line + "\n")
        self.fp.flush()
        return True


def progress_bar(*, file=None, disable: bool = False, **kwargs) -> tqdm:
    """A tqdm bar on a terminal, PlainProgress elsewhere; takes tqdm's arguments."""
    file = file if file is not None else sys.stderr
    if disable or _isatty(file):
        return tqdm(file=file, disable=disable, **kwargs)
    every = float(os.environ.get(PROGRESS_EVERY_ENV) or DEFAULT_EVERY_S)
    for terminal_only in ("dynamic_ncols", "mininterval", "maxinterval", "miniters"):
        kwargs.pop(terminal_only, None)
    return PlainProgress(file=file, mininterval=every, maxinterval=every, miniters=1, delay=every, **kwargs)


def byte_bar(desc: str, total: int | None = None) -> tqdm:
    """A bar over bytes of text: shows MB done, MB/s and the postfix set by the caller."""
    return progress_bar(
        total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, mininterval=0.5, dynamic_ncols=True
    )


def summary(stage: str, message: str, started: float) -> None:
    """Print `<stage>: <message> in <seconds> s` as the stage's last line."""
    print(f"{stage}: {message} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
