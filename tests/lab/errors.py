"""The one error type of the test lab."""

from __future__ import annotations


class LabError(RuntimeError):
    """The lab could not build, change or tear down a test host, payload or mount."""
