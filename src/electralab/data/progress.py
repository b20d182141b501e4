"""Progress bars and one-line summaries for the long data steps, on stderr.

Bars count bytes of text (so tqdm shows MB and MB/s) and carry documents/tokens as a postfix. They draw
only on a terminal (`disable=None`): DVC passes the user's terminal through; logs and tests stay clean.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def byte_bar(desc: str, total: int | None = None) -> tqdm:
    """A bar over bytes of text: shows MB done, MB/s and the postfix set by the caller."""
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000,
                mininterval=0.5, disable=None, file=sys.stderr, dynamic_ncols=True)


def summary(stage: str, message: str, started: float) -> None:
    """Print `<stage>: <message> in <seconds> s` as the stage's last line."""
    print(f"{stage}: {message} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
