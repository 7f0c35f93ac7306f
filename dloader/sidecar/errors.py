"""The sidecar's domain errors; the server maps each to a gRPC status code."""

from __future__ import annotations

__all__ = ["AlreadyExists", "InvalidArgument", "NotFound", "PermissionDenied", "SidecarError"]


class SidecarError(Exception):
    """A request the sidecar refuses; ``field`` names the offending request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidArgument(SidecarError):
    """Malformed or out-of-range input (INVALID_ARGUMENT)."""


class NotFound(SidecarError):
    """An unknown job (NOT_FOUND)."""


class PermissionDenied(SidecarError):
    """A token that does not authorise the job (PERMISSION_DENIED)."""


class AlreadyExists(SidecarError):
    """An id that is already taken (ALREADY_EXISTS)."""
