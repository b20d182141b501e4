"""What every stage script shares: expected errors end the stage with one clear line and exit 2."""

from __future__ import annotations

import sys
from typing import Callable

from electralab.errors import EXPECTED_ERRORS


def stage_main(main: Callable[[], None]) -> None:
    try:
        main()
    except EXPECTED_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
