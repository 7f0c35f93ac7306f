"""What the node benchmarks read in a sidecar's log: the patterns of its lines (registration,
the model's expectation, time stamps, placement). One copy, for ``bench_sidecar`` and its
generated mixes."""

from __future__ import annotations

import re

__all__ = ["PLACED", "PREDICTED", "REGISTERED", "STAMP"]

REGISTERED = re.compile(r"job (\S+) \((\S+)\) registered")
PREDICTED = re.compile(r"job (\S+): (\d+) workers \(.*\) \[model: ([\d,]+) samples/s\]$")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)")
PLACED = re.compile(r"job (\S+): placed by its model ([\d.]+) s after registering")
