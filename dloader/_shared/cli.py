"""argparse types every command line shares: numbers that must be finite (``nan`` and ``inf``
are refused everywhere, with the flag named by argparse), within a range where one applies,
and log levels by name."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["LOG_LEVELS", "count", "finite", "number", "positive", "seconds"]

#: The log levels every command takes (``--log-level``).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def number(
    low: float = -math.inf, high: float = math.inf, *, integer: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number within ``[low, high]`` (an int if ``integer``)."""

    def parse(text: str) -> float:
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected a finite number within [{low:g}, {high:g}]"
            )
        return value

    parse.__name__ = "int" if integer else "float"  # what argparse says it expected
    return parse


#: Any finite number.
finite = number()
#: A finite number > 0 (a size, a speed).
positive = number(1e-6)
#: Seconds: finite, from 0 to a week.
seconds = number(0.0, 7 * 86400.0)
#: A count: an integer >= 0.
count = number(0, 2**31 - 1, integer=True)
