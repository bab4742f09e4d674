"""Test harness shipped with Apiary."""

from apiary.testing.clock import FakeClock
from apiary.testing.ids import SequentialIds

__all__ = ["FakeClock", "SequentialIds"]
