"""The package version (its own module, so that storage can record it without importing the package)."""

__version__ = "0.1.0"
