"""Algorithms written as sequences of tile operations and small in-core steps."""
