"""Apiary conformance manifest and its checks."""
