"""The agent's tests run against the real sidecar the sidecar's tests use."""

from tests.sidecar.conftest import sidecar

__all__ = ["sidecar"]
