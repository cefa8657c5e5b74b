"""Bringing results up to date after rows were appended to their inputs (:func:`update`)."""

from blocklin.linalg.update.update import UPDATABLE, update

__all__ = ["UPDATABLE", "update"]
