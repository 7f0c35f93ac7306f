"""The daemons' one precedence rule for their settings.

**A flag given on the command line > its environment variable > what the daemon stored at run
time** (``dloaderctl policy set`` for the sidecar, ``Configure`` for the allocator) **> the
built-in default.** So a setting changed at run time survives a restart, unless the operator's
command line says otherwise; either way the daemon logs which source won.

Environment variables are read where the flag's default is filled in (:mod:`dloader._shared.env`),
so a flag that is ``None`` here was given neither on the command line nor in the environment.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["layered"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def layered(default: T, stored: T | None, flags: Mapping[str, Any], *, stored_by: str) -> T:
    """The settings object by the module's rule: ``stored`` (else ``default``) with every flag
    that was given (not ``None``) over it. ``flags`` maps field names of the dataclass to the
    parsed flags; ``stored_by`` names what stores settings, for the log line."""
    base = default if stored is None else stored
    given = {name: value for name, value in flags.items() if value is not None}
    result = dataclasses.replace(base, **given)  # type: ignore[type-var]
    if stored is not None:
        over = f", with {', '.join(sorted(given))} from the command line over it" if given else ""
        log.info("settings %s: stored by %s%s", result, stored_by, over)
    return result
