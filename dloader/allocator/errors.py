"""Exceptions of the allocator package."""

from __future__ import annotations

__all__ = ["AllocatorError"]


class AllocatorError(ValueError):
    """Invalid input to the optimizer, a policy, the simulator or its trace files."""
