"""Apiary: a coordination server for process-isolated agents (the SW4RM protocol)."""

__version__ = "0.1.0"
